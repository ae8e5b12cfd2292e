"""The SQS query protocol (docs/sqs.md): a form-encoded request (`Action=SendMessage&...`,
POSTed to the endpoint or a queue URL, or a GET with the query string) decoded into the input
object the JSON 1.0 actions take, and an action's output encoded as the query protocol's XML.
A translation only: the actions are the same.

The names and shapes below are SQS's API model's for the query protocol (its `locationName`
and `flattened` traits), written out for the actions vqueues does: the last SQS model of the
query protocol, botocore 1.34.22's, is kept in tests/data/botocore_sqs_query, and
tests/unit/api/sqs/test_query.py checks this table against it through botocore's own
serializer and parser. `MessageSystemAttributeNames` came after that model, with JSON 1.0;
its query name follows `AttributeNames`'."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from vqueues.api.sqs.protocol import SqsError, xml_text

NAMESPACE = "http://queue.amazonaws.com/doc/2012-11-05/"


@dataclass(frozen=True, slots=True)
class Scalar:
    kind: str  # "string" (blobs too: base64 on both wires), "integer" or "boolean"


@dataclass(frozen=True, slots=True)
class ListOf:
    """A flattened list: its items are `<wire>.1`, `<wire>.2`, ... (repeated `<wire>`
    elements in XML)."""

    item: Shape


@dataclass(frozen=True, slots=True)
class MapOf:
    """A flattened map: entries `<wire>.N.<key>` and `<wire>.N.<value>`."""

    key: str
    value: str
    item: Shape


@dataclass(frozen=True, slots=True)
class Member:
    name: str  # JSON's
    wire: str  # the query protocol's
    shape: Shape


@dataclass(frozen=True, slots=True)
class Struct:
    members: tuple[Member, ...]


Shape = Scalar | ListOf | MapOf | Struct
STRING, INTEGER, BOOLEAN = Scalar("string"), Scalar("integer"), Scalar("boolean")


def _struct(*members: str | Member) -> Struct:
    """A structure; a bare name is a string member of the same name on both wires."""
    return Struct(tuple(m if isinstance(m, Member) else Member(m, m, STRING)
                        for m in members))


def _integers(*names: str) -> tuple[Member, ...]:
    return tuple(Member(n, n, INTEGER) for n in names)


_ATTRIBUTES = MapOf("Name", "Value", STRING)
_VALUE = _struct("StringValue", "BinaryValue",
                 Member("StringListValues", "StringListValue", ListOf(STRING)),
                 Member("BinaryListValues", "BinaryListValue", ListOf(STRING)), "DataType")
_MESSAGE_ATTRIBUTES = MapOf("Name", "Value", _VALUE)
_NAMES = ListOf(STRING)
_FAILED = Member("Failed", "BatchResultErrorEntry", ListOf(_struct(
    "Id", Member("SenderFault", "SenderFault", BOOLEAN), "Code", "Message")))
_SEND: tuple[str | Member, ...] = ("MessageBody", *_integers("DelaySeconds"),
         Member("MessageAttributes", "MessageAttribute", _MESSAGE_ATTRIBUTES),
         Member("MessageSystemAttributes", "MessageSystemAttribute", _MESSAGE_ATTRIBUTES),
         "MessageDeduplicationId", "MessageGroupId")
_SENT: tuple[str, ...] = ("MessageId", "MD5OfMessageBody", "MD5OfMessageAttributes",
         "MD5OfMessageSystemAttributes", "SequenceNumber")
_URL = _struct("QueueUrl")


def _batch(name: str, *entry: str | Member) -> Member:
    return Member("Entries", f"{name}RequestEntry", ListOf(_struct("Id", *entry)))


def _settled(name: str) -> Struct:
    return _struct(Member("Successful", f"{name}ResultEntry", ListOf(_struct("Id"))), _FAILED)


# Action -> (its input, its output: None for an action that answers nothing but its id).
ACTIONS: dict[str, tuple[Struct, Struct | None]] = {
    "CreateQueue": (_struct("QueueName", Member("Attributes", "Attribute", _ATTRIBUTES),
                            Member("tags", "Tag", MapOf("Key", "Value", STRING))), _URL),
    "GetQueueUrl": (_struct("QueueName", "QueueOwnerAWSAccountId"), _URL),
    "ListQueues": (_struct("QueueNamePrefix", "NextToken", *_integers("MaxResults")),
                   _struct(Member("QueueUrls", "QueueUrl", ListOf(STRING)), "NextToken")),
    "DeleteQueue": (_URL, None),
    "PurgeQueue": (_URL, None),
    "GetQueueAttributes": (_struct("QueueUrl", Member("AttributeNames", "AttributeName",
                                                      _NAMES)),
                           _struct(Member("Attributes", "Attribute", _ATTRIBUTES))),
    "SetQueueAttributes": (_struct("QueueUrl", Member("Attributes", "Attribute", _ATTRIBUTES)),
                           None),
    "SendMessage": (_struct("QueueUrl", *_SEND), _struct(*_SENT)),
    "SendMessageBatch": (
        _struct("QueueUrl", _batch("SendMessageBatch", *_SEND)),
        _struct(Member("Successful", "SendMessageBatchResultEntry", ListOf(_struct(
            "Id", *_SENT))), _FAILED)),
    "ReceiveMessage": (
        _struct("QueueUrl", Member("AttributeNames", "AttributeName", _NAMES),
                Member("MessageSystemAttributeNames", "MessageSystemAttributeName", _NAMES),
                Member("MessageAttributeNames", "MessageAttributeName", _NAMES),
                *_integers("MaxNumberOfMessages", "VisibilityTimeout", "WaitTimeSeconds"),
                "ReceiveRequestAttemptId"),
        _struct(Member("Messages", "Message", ListOf(_struct(
            "MessageId", "ReceiptHandle", "MD5OfBody", "Body",
            Member("Attributes", "Attribute", _ATTRIBUTES), "MD5OfMessageAttributes",
            Member("MessageAttributes", "MessageAttribute", _MESSAGE_ATTRIBUTES)))))),
    "DeleteMessage": (_struct("QueueUrl", "ReceiptHandle"), None),
    "DeleteMessageBatch": (_struct("QueueUrl", _batch("DeleteMessageBatch", "ReceiptHandle")),
                           _settled("DeleteMessageBatch")),
    "ChangeMessageVisibility": (_struct("QueueUrl", "ReceiptHandle",
                                        *_integers("VisibilityTimeout")), None),
    "ChangeMessageVisibilityBatch": (
        _struct("QueueUrl", _batch("ChangeMessageVisibilityBatch", "ReceiptHandle",
                                   *_integers("VisibilityTimeout"))),
        _settled("ChangeMessageVisibilityBatch")),
}

# Decoding ---------------------------------------------------------------------------------

_INDEX = re.compile(r"[1-9][0-9]{0,8}")
_INTEGER = re.compile(r"-?[0-9]{1,18}")


class _Node:
    """The parameters under one dotted prefix: its own value and its children by segment."""

    __slots__ = ("children", "value")

    def __init__(self) -> None:
        self.value: str | None = None
        self.children: dict[str, _Node] = {}


def _tree(params: Iterable[tuple[str, str]]) -> _Node:
    root = _Node()
    for key, value in params:
        node = root
        for segment in key.split("."):
            node = node.children.setdefault(segment, _Node())
        if node.value is not None:
            raise SqsError("InvalidParameterValue", f"The parameter {key} is given twice.")
        node.value = value
    return root


def decode(params: Iterable[tuple[str, str]]) -> tuple[str, dict[str, Any]]:
    """(the action, its input object as JSON 1.0 gives it) of a query request's parameters;
    parameters the action does not take are ignored, as unknown JSON members are. Integers
    are decoded where the JSON input has integers (others stay text, which the action
    refuses as it refuses a JSON string there)."""
    root = _tree(params)
    action = root.children.get("Action")
    name = action.value if action is not None else None
    if not name:
        raise SqsError("InvalidAction", "a query request must give the parameter Action")
    shape = ACTIONS.get(name)
    return name, {} if shape is None else _decode_struct(root, shape[0], "")


def _decode_struct(node: _Node, shape: Struct, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in shape.members:
        child = node.children.get(m.wire)
        value = None if child is None else _decode(child, m.shape, path + m.wire)
        if value is not None:
            out[m.name] = value
        elif isinstance(m.shape, ListOf):
            empty = node.children.get(m.name)  # how an empty list is sent: `Entries=`
            if empty is not None and empty.value == "" and not empty.children:
                out[m.name] = []
    return out


def _indexed(node: _Node) -> list[tuple[str, _Node]]:
    return sorted(((k, c) for k, c in node.children.items() if _INDEX.fullmatch(k)),
                  key=lambda kc: int(kc[0]))


def _decode(node: _Node, shape: Shape, path: str) -> Any:
    if isinstance(shape, Scalar):
        if shape.kind == "integer" and node.value is not None and _INTEGER.fullmatch(
                node.value):
            return int(node.value)
        return node.value
    if isinstance(shape, Struct):
        return _decode_struct(node, shape, path + ".")
    items = _indexed(node)
    if not items:
        return None
    if isinstance(shape, ListOf):
        return [_decode(c, shape.item, f"{path}.{i}") for i, c in items]
    out: dict[str, Any] = {}
    for i, entry in items:
        key = entry.children.get(shape.key)
        if key is None or key.value is None:
            raise SqsError("MissingParameter", f"The request must contain the parameter "
                           f"{path}.{i}.{shape.key}.")
        if key.value in out:
            raise SqsError("InvalidParameterValue", f"{path}.{i}.{shape.key}: {key.value!r} "
                           "is given twice.")
        value = entry.children.get(shape.value)
        out[key.value] = None if value is None else _decode(
            value, shape.item, f"{path}.{i}.{shape.value}")
    return out


# Encoding ---------------------------------------------------------------------------------


def encode(action: str, output: Mapping[str, Any], request_id: str) -> str:
    """The query protocol's answer to `action` with the JSON action's output."""
    parts = [f'<?xml version="1.0"?><{action}Response xmlns="{NAMESPACE}">']
    shape = ACTIONS[action][1]
    if shape is not None:
        _encode(parts, f"{action}Result", output, shape)
    parts.append(f"<ResponseMetadata><RequestId>{xml_text(request_id)}</RequestId>"
                 f"</ResponseMetadata></{action}Response>")
    return "".join(parts)


def _encode(parts: list[str], name: str, value: Any, shape: Shape) -> None:
    if value is None:
        return
    if isinstance(shape, Scalar):
        text = xml_text(str(value)) if shape.kind != "boolean" else str(bool(value)).lower()
        parts.append(f"<{name}>{text}</{name}>")
    elif isinstance(shape, ListOf):
        for item in value:
            _encode(parts, name, item, shape.item)
    elif isinstance(shape, MapOf):
        for key, item in value.items():
            parts.append(f"<{name}><{shape.key}>{xml_text(key)}</{shape.key}>")
            _encode(parts, shape.value, item, shape.item)
            parts.append(f"</{name}>")
    else:
        parts.append(f"<{name}>")
        for m in shape.members:
            _encode(parts, m.wire, value.get(m.name), m.shape)
        parts.append(f"</{name}>")


def xml_answer(action: str, output: Mapping[str, Any], request_id: str) -> web.Response:
    return web.Response(text=encode(action, output, request_id), content_type="text/xml",
                        headers={"x-amzn-RequestId": request_id})
