"""The wire: AWS JSON 1.0 requests (`X-Amz-Target: AmazonSQS.<Action>`, content type
`application/x-amz-json-1.0`) and their answers, and errors in SQS's shapes: a JSON body
`{"__type": "com.amazonaws.sqs#<Name>", "message"}` with the `x-amzn-query-error` header
(`<code>;Sender`) that SDKs of the older query protocol's error codes read; and the query
protocol's XML error (its requests and answers: query.py)."""

from __future__ import annotations

import json
import random
import re
import uuid
from typing import Any

from aiohttp import web

JSON_TYPE = "application/x-amz-json-1.0"
FORM_TYPE = "application/x-www-form-urlencoded"
TARGET_PREFIX = "AmazonSQS."

# Name -> (HTTP status, the query protocol's code, fault). The codes are those of SQS's API
# model (its awsQueryError traits); the common errors' are AWS's common error codes.
ERRORS: dict[str, tuple[int, str, str]] = {
    "QueueDoesNotExist": (400, "AWS.SimpleQueueService.NonExistentQueue", "Sender"),
    "QueueNameExists": (400, "QueueAlreadyExists", "Sender"),
    "ReceiptHandleIsInvalid": (404, "ReceiptHandleIsInvalid", "Sender"),
    "BatchEntryIdsNotDistinct": (400, "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
                                 "Sender"),
    "EmptyBatchRequest": (400, "AWS.SimpleQueueService.EmptyBatchRequest", "Sender"),
    "TooManyEntriesInBatchRequest": (
        400, "AWS.SimpleQueueService.TooManyEntriesInBatchRequest", "Sender"),
    "InvalidBatchEntryId": (400, "AWS.SimpleQueueService.InvalidBatchEntryId", "Sender"),
    "BatchRequestTooLong": (400, "AWS.SimpleQueueService.BatchRequestTooLong", "Sender"),
    "MessageNotInflight": (400, "AWS.SimpleQueueService.MessageNotInflight", "Sender"),
    "UnsupportedOperation": (400, "AWS.SimpleQueueService.UnsupportedOperation", "Sender"),
    "InvalidAttributeName": (400, "InvalidAttributeName", "Sender"),
    "InvalidAttributeValue": (400, "InvalidAttributeValue", "Sender"),
    "InvalidMessageContents": (400, "InvalidMessageContents", "Sender"),
    "RequestThrottled": (403, "RequestThrottled", "Sender"),
    "InvalidParameterValue": (400, "InvalidParameterValue", "Sender"),
    "MissingParameter": (400, "MissingParameter", "Sender"),
    "InvalidAction": (400, "InvalidAction", "Sender"),
    "AccessDenied": (403, "AccessDenied", "Sender"),
    "MissingAuthenticationToken": (403, "MissingAuthenticationToken", "Sender"),
    "IncompleteSignature": (400, "IncompleteSignature", "Sender"),
    "InvalidClientTokenId": (403, "InvalidClientTokenId", "Sender"),
    "SignatureDoesNotMatch": (403, "SignatureDoesNotMatch", "Sender"),
    "ServiceUnavailable": (503, "ServiceUnavailable", "Receiver"),
    "InternalFailure": (500, "InternalFailure", "Receiver"),
}


class SqsError(Exception):
    """An error answered in SQS's shape; `name` is a key of ERRORS."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name
        self.message = message

    @property
    def status(self) -> int:
        return ERRORS[self.name][0]

    @property
    def code(self) -> str:
        """The query protocol's code (AWS.SimpleQueueService.NonExistentQueue, ...)."""
        return ERRORS[self.name][1]

    @property
    def sender_fault(self) -> bool:
        return ERRORS[self.name][2] == "Sender"


def new_id() -> str:
    """A random (version 4) UUID for a MessageId or a request id. Python's generator rather
    than uuid4's os.urandom: a system call per id cost 10-20 µs under load here, and these
    ids are names, not secrets."""
    return str(uuid.UUID(int=random.getrandbits(128), version=4))


def decode_json(raw: bytes) -> dict[str, Any]:
    """A JSON 1.0 request's input object (an empty body is `{}`)."""
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise SqsError("InvalidParameterValue", "the request body is not JSON") from None
    if not isinstance(body, dict):
        raise SqsError("InvalidParameterValue", "the request body is not a JSON object")
    return body


def json_answer(output: dict[str, Any], request_id: str) -> web.Response:
    return web.Response(body=json.dumps(output, ensure_ascii=False, separators=(",", ":")),
                        content_type=JSON_TYPE, charset=None,
                        headers={"x-amzn-RequestId": request_id})


def json_error(error: SqsError, request_id: str) -> web.Response:
    body = {"__type": f"com.amazonaws.sqs#{error.name}", "message": error.message}
    fault = ERRORS[error.name][2]
    headers = {"x-amzn-RequestId": request_id, "x-amzn-query-error": f"{error.code};{fault}"}
    if error.status == 503:
        headers["Retry-After"] = "1"
    return web.Response(body=json.dumps(body, ensure_ascii=False), status=error.status,
                        content_type=JSON_TYPE, charset=None, headers=headers)


_ESCAPES = {"&": "&amp;", "<": "&lt;", ">": "&gt;", "\r": "&#xD;"}
# What XML text must escape; and characters XML 1.0 cannot carry at all (a body SQS takes has
# none, but a record another producer wrote may), which become U+FFFD.
_TO_ESCAPE = re.compile("[&<>\r]|[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_text(text: str) -> str:
    """`text` as XML character data. A carriage return is a reference (`&#xD;`): a parser
    turns a literal one, and CR LF, into a line feed."""
    return _TO_ESCAPE.sub(lambda m: _ESCAPES.get(m.group(), "\ufffd"), text)


def xml_error(error: SqsError, request_id: str) -> web.Response:
    """The query protocol's ErrorResponse."""
    fault = ERRORS[error.name][2]
    body = ('<?xml version="1.0"?><ErrorResponse xmlns="http://queue.amazonaws.com/doc/'
            f'2012-11-05/"><Error><Type>{fault}</Type><Code>{xml_text(error.code)}</Code>'
            f"<Message>{xml_text(error.message)}</Message><Detail/></Error>"
            f"<RequestId>{request_id}</RequestId></ErrorResponse>")
    headers = {"x-amzn-RequestId": request_id}
    if error.status == 503:
        headers["Retry-After"] = "1"
    return web.Response(text=body, status=error.status, content_type="text/xml",
                        headers=headers)
