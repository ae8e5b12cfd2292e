"""Messages: what SendMessage's entries become (a record: the body as its value, the rest in
headers) and what ReceiveMessage answers from a leased record (docs/sqs.md)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vqueues.api.sqs.attributes import is_fifo, queue_arn
from vqueues.api.sqs.digests import MessageAttribute, md5_of_attributes, md5_of_body
from vqueues.api.sqs.handles import encode_handle
from vqueues.api.sqs.protocol import SqsError, new_id
from vqueues.records import NewRecord, Record, now_ms
from vqueues.results import LeasedRecord
from vqueues.state.consumer_config import ORDER_KEY_HEADER
from vqueues.state.idempotency import KEY_HEADER
from vqueues.state.schedule import DELIVER_AT_HEADER

MESSAGE_ID_HEADER = "vq-sqs-message-id"
ATTRIBUTES_HEADER = "vq-sqs-attributes"
TRACE_HEADER = "vq-sqs-trace-header"  # the AWSTraceHeader system attribute sent with it
TRACE = "AWSTraceHeader"  # the one system attribute a message is sent with
SENDER_HEADER = "vq-sqs-sender-id"  # SenderId: the access key id of the send
DEDUP_PREFIX = "sqs:"  # SQS deduplication ids among a queue's idempotency keys
DLQ_QUEUE_HEADER, DLQ_OFFSET_HEADER = "vq-dlq-source-queue", "vq-dlq-source-offset"
MAX_ATTRIBUTES = 10
MAX_DELAY_S = 900
# A record enqueued by vqueues' own API has a MessageId made from (queue, offset) in this space.
MESSAGE_IDS = uuid.UUID("6d1f5a8e-2b7c-4f0e-9a51-3c0b8e7d2f40")
# Characters SQS allows in a body or a string attribute (XML 1.0's).
_NOT_ALLOWED = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_ATTRIBUTE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,256}")
_GROUP_ID = re.compile(r"[\x21-\x7e]{1,128}")


@dataclass(slots=True)
class Outgoing:
    """A message to send: its record, and what SendMessage answers for it."""

    record: NewRecord
    message_id: str
    md5_body: str
    md5_attributes: str | None
    dedup_id: str | None
    md5_system: str | None = None  # MD5OfMessageSystemAttributes, when sent with some


def _text(field: str, value: str) -> str:
    if _NOT_ALLOWED.search(value):
        raise SqsError("InvalidMessageContents", f"Invalid characters found in {field}: "
                       "only #x9, #xA, #xD, #x20 to #xD7FF, #xE000 to #xFFFD and #x10000 to "
                       "#x10FFFF are allowed")
    return value


def parse_attributes(given: Any) -> dict[str, MessageAttribute]:
    """SendMessage's MessageAttributes (BinaryValue is base64 in JSON)."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise SqsError("InvalidParameterValue", "MessageAttributes must be an object")
    if len(given) > MAX_ATTRIBUTES:
        raise SqsError("InvalidParameterValue", f"Number of message attributes "
                       f"[{len(given)}] exceeds the allowed maximum [{MAX_ATTRIBUTES}].")
    out = {}
    for name, a in given.items():
        if not _ATTRIBUTE_NAME.fullmatch(name) or ".." in name or name.startswith(
                ".") or name.endswith(".") or name.lower().startswith(("aws.", "amazon.")):
            raise SqsError("InvalidParameterValue", f"Message attribute name {name!r} is "
                           "invalid")
        if not isinstance(a, dict) or not isinstance(a.get("DataType"), str):
            raise SqsError("InvalidParameterValue", f"The message attribute {name!r} must "
                           "contain a DataType")
        kind = a["DataType"]
        base = kind.split(".", 1)[0]
        if base not in ("String", "Number", "Binary") or len(kind) > 256:
            raise SqsError("InvalidParameterValue", f"The type of message attribute {name!r} "
                           "is invalid: String, Number or Binary, maybe with a suffix")
        if a.get("StringListValues") or a.get("BinaryListValues"):
            raise SqsError("InvalidParameterValue", "StringListValues and BinaryListValues "
                           "are not supported")
        if base == "Binary":
            raw = a.get("BinaryValue")
            try:
                value = base64.b64decode(raw, validate=True) if isinstance(raw, str) else None
            except (binascii.Error, ValueError):
                value = None
            if not value:
                raise SqsError("InvalidParameterValue", f"The message attribute {name!r} "
                               "with type 'Binary' must have a non-empty BinaryValue")
            out[name] = MessageAttribute(kind, binary=value)
        else:
            text = a.get("StringValue")
            if not isinstance(text, str) or not text:
                raise SqsError("InvalidParameterValue", f"The message attribute {name!r} "
                               f"with type {base!r} must have a non-empty StringValue")
            if base == "Number" and not _is_number(text):
                raise SqsError("InvalidParameterValue", f"The message attribute {name!r} "
                               "with type 'Number' must hold a number")
            out[name] = MessageAttribute(kind, string=_text(f"message attribute {name}", text))
    return out


def parse_system_attributes(given: Any) -> str | None:
    """SendMessage's MessageSystemAttributes: AWSTraceHeader alone, of type String; its
    value (None: none given)."""
    if given is None:
        return None
    if not isinstance(given, dict):
        raise SqsError("InvalidParameterValue", "MessageSystemAttributes must be an object")
    trace = None
    for name, a in given.items():
        if name != TRACE:
            raise SqsError("InvalidParameterValue", f"Message system attribute name {name!r} "
                           f"is invalid: {TRACE} is the only one a message is sent with")
        if not isinstance(a, dict) or a.get("DataType") != "String" or a.get(
                "BinaryValue") is not None or a.get("StringListValues") or a.get(
                "BinaryListValues"):
            raise SqsError("InvalidParameterValue", f"The message system attribute {TRACE} "
                           "must be of type String, with a StringValue")
        text = a.get("StringValue")
        if not isinstance(text, str) or not text:
            raise SqsError("InvalidParameterValue", f"The message system attribute {TRACE} "
                           "must have a non-empty StringValue")
        trace = _text(f"message system attribute {TRACE}", text)
    return trace


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return len(text) <= 38 + 3


def _attributes_json(attributes: Mapping[str, MessageAttribute]) -> bytes:
    return json.dumps({n: [a.data_type, a.string] if a.binary is None else
                       [a.data_type, None, base64.b64encode(a.binary).decode()]
                       for n, a in attributes.items()}, ensure_ascii=False).encode("utf-8")


def stored_attributes(headers: tuple[tuple[str, bytes | None], ...]
                      ) -> dict[str, MessageAttribute]:
    for name, value in headers:
        if name == ATTRIBUTES_HEADER and value:
            try:
                found = json.loads(value)
                return {n: MessageAttribute(v[0], v[1]) if len(v) < 3 else
                        MessageAttribute(v[0], binary=base64.b64decode(v[2]))
                        for n, v in found.items()}
            except (ValueError, TypeError, IndexError, KeyError, binascii.Error):
                return {}
    return {}


def outgoing(entry: Mapping[str, Any], queue: str, kept: Mapping[str, str],
             sender: str | None) -> Outgoing:
    """A SendMessage(Batch) entry, checked, as a record to enqueue; `sender`: the SenderId
    receivers are answered."""
    fifo = is_fifo(queue)
    body = entry.get("MessageBody")
    if not isinstance(body, str) or not body:
        raise SqsError("MissingParameter", "The request must contain the parameter "
                       "MessageBody.")
    _text("the message body", body)
    attributes = parse_attributes(entry.get("MessageAttributes"))
    trace = parse_system_attributes(entry.get("MessageSystemAttributes"))
    # System attributes do not count toward the message's size (SQS's SendMessage).
    size = len(body.encode("utf-8")) + sum(
        len(n.encode()) + len(a.data_type.encode()) + len(a.value_bytes())
        for n, a in attributes.items())
    limit = int(kept.get("MaximumMessageSize", "262144"))
    if size > limit:
        raise SqsError("InvalidParameterValue", "One or more parameters are invalid. Reason: "
                       f"Message must be shorter than {limit} bytes.")
    delay = _delay(entry.get("DelaySeconds"), fifo, kept)
    group, dedup = entry.get("MessageGroupId"), entry.get("MessageDeduplicationId")
    message_id = new_id()
    headers: list[tuple[str, bytes]] = [(MESSAGE_ID_HEADER, message_id.encode())]
    if attributes:
        headers.append((ATTRIBUTES_HEADER, _attributes_json(attributes)))
    if trace is not None:
        headers.append((TRACE_HEADER, trace.encode("utf-8")))
    if sender is not None:
        headers.append((SENDER_HEADER, sender.encode("utf-8")))
    if fifo:
        if group is None:
            raise SqsError("MissingParameter", "The request must contain the parameter "
                           "MessageGroupId.")
        if not isinstance(group, str) or not _GROUP_ID.fullmatch(group):
            raise SqsError("InvalidParameterValue", "MessageGroupId: 1 to 128 characters of "
                           "alphanumerics and punctuation")
        if dedup is None:
            if kept.get("ContentBasedDeduplication") != "true":
                raise SqsError("InvalidParameterValue", "The queue should either have "
                               "ContentBasedDeduplication enabled or MessageDeduplicationId "
                               "provided explicitly")
            dedup = hashlib.sha256(body.encode("utf-8")).hexdigest()
        if not isinstance(dedup, str) or not _GROUP_ID.fullmatch(dedup):
            raise SqsError("InvalidParameterValue", "MessageDeduplicationId: 1 to 128 "
                           "characters of alphanumerics and punctuation")
        headers += [(ORDER_KEY_HEADER, group.encode()),
                    (KEY_HEADER, (DEDUP_PREFIX + dedup).encode())]
    elif group is not None or dedup is not None:
        raise SqsError("InvalidParameterValue", "MessageGroupId and MessageDeduplicationId "
                       "are for FIFO queues: a standard queue does not take them here")
    if delay:
        headers.append((DELIVER_AT_HEADER, str(now_ms() + delay * 1000).encode()))
    return Outgoing((body.encode("utf-8"), headers), message_id, md5_of_body(body),
                    md5_of_attributes(attributes) if attributes else None, dedup,
                    None if trace is None else md5_of_attributes(
                        {TRACE: MessageAttribute("String", trace)}))


def _delay(delay: Any, fifo: bool, kept: Mapping[str, str]) -> int:
    """A message's DelaySeconds (a standard queue's only), or the queue's."""
    if delay is None:
        return int(kept.get("DelaySeconds", "0"))
    if fifo:
        raise SqsError("InvalidParameterValue", "Value for parameter DelaySeconds is "
                       "invalid. Reason: The request include parameter that is not valid "
                       "for this queue type.")
    if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay <= MAX_DELAY_S:
        raise SqsError("InvalidParameterValue", "Value for parameter DelaySeconds is "
                       f"invalid. Reason: DelaySeconds must be >= 0 and <= {MAX_DELAY_S}.")
    return delay


def _header(record: Record, name: str) -> str | None:
    for k, v in record.headers:
        if k == name and v is not None:
            return v.decode("utf-8", "replace")
    return None


def message_id_of(queue: str, record: Record) -> str:
    """The MessageId SendMessage gave the record (kept through delays and dead letters), or
    for a record another producer wrote, one made from where it was first written."""
    found = _header(record, MESSAGE_ID_HEADER)
    if found:
        return found
    source, offset = _header(record, DLQ_QUEUE_HEADER), _header(record, DLQ_OFFSET_HEADER)
    if source is not None and offset is not None:
        queue, at = source, offset
    else:
        at = str(record.offset)
    return str(uuid.uuid5(MESSAGE_IDS, f"{queue}\n{at}"))


def _wanted(names: Any, field: str) -> list[str]:
    if names is None:
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SqsError("InvalidParameterValue", f"{field} must be a list of names")
    return names


def attribute_filter(names: Any) -> tuple[bool, set[str], tuple[str, ...]]:
    """ReceiveMessage's MessageAttributeNames: (all, exact names, prefixes of `prefix.*`)."""
    wanted = _wanted(names, "MessageAttributeNames")
    every = any(n in ("All", ".*") for n in wanted)
    prefixes = tuple(n[:-1] for n in wanted if n.endswith(".*") and n != ".*")
    return every, {n for n in wanted if not n.endswith(".*")}, prefixes


SYSTEM_NAMES = ("SenderId", "SentTimestamp", "ApproximateReceiveCount",
                "ApproximateFirstReceiveTimestamp", "SequenceNumber", "MessageDeduplicationId",
                "MessageGroupId", "AWSTraceHeader", "DeadLetterQueueSourceArn")


def system_names(body: Mapping[str, Any]) -> set[str]:
    """ReceiveMessage's AttributeNames and MessageSystemAttributeNames, `All` expanded."""
    names = set(_wanted(body.get("AttributeNames"), "AttributeNames")) | set(
        _wanted(body.get("MessageSystemAttributeNames"), "MessageSystemAttributeNames"))
    return set(SYSTEM_NAMES) if "All" in names else names


def received(queue: str, leased: LeasedRecord, system: set[str],
             wanted: tuple[bool, set[str], tuple[str, ...]], region: str, account: str
             ) -> dict[str, Any]:
    """A Message of ReceiveMessage's answer."""
    record = leased.record
    body = (record.value or b"").decode("utf-8", "replace")
    out: dict[str, Any] = {"MessageId": message_id_of(queue, record),
                           "ReceiptHandle": encode_handle(queue, leased.token),
                           "MD5OfBody": md5_of_body(body), "Body": body}
    values = {"SentTimestamp": str(record.timestamp),
              "ApproximateReceiveCount": str(leased.attempt)}
    if leased.first_leased:
        values["ApproximateFirstReceiveTimestamp"] = str(leased.first_leased)
    if is_fifo(queue):
        group = _header(record, ORDER_KEY_HEADER)
        key = _header(record, KEY_HEADER)
        if group is not None:
            values["MessageGroupId"] = group
        if key is not None and key.startswith(DEDUP_PREFIX):
            values["MessageDeduplicationId"] = key[len(DEDUP_PREFIX):]
        values["SequenceNumber"] = str(record.offset)
    trace = _header(record, TRACE_HEADER)
    if trace is not None:
        values[TRACE] = trace
    sender = _header(record, SENDER_HEADER)
    if sender is not None:
        values["SenderId"] = sender
    source = _header(record, DLQ_QUEUE_HEADER)
    if source is not None:
        values["DeadLetterQueueSourceArn"] = queue_arn(region, account, source)
    chosen = {k: v for k, v in values.items() if k in system}
    if chosen:
        out["Attributes"] = chosen
    every, names, prefixes = wanted
    if every or names or prefixes:
        stored = stored_attributes(record.headers)
        picked = {n: a for n, a in stored.items()
                  if every or n in names or n.startswith(prefixes)}
        if picked:
            out["MD5OfMessageAttributes"] = md5_of_attributes(picked)
            out["MessageAttributes"] = {
                n: {"DataType": a.data_type, "StringValue": a.string} if a.binary is None else
                {"DataType": a.data_type, "BinaryValue": base64.b64encode(a.binary).decode()}
                for n, a in picked.items()}
    return out
