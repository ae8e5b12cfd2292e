"""One function per SQS action, each over the services the other API modules call: the
`sqs` lease consumer's settings and leases (WorkService), enqueues and queue deletions (the
queue service). docs/sqs.md says what maps to what."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from vqueues.api.keys import QUOTAS, SERVICE, SETTINGS, SQS_ATTEMPTS, WORK
from vqueues.api.proxy import proxy
from vqueues.api.sqs.attempts import Answered, Attempt, ReceiveAttempts, check_attempt_id
from vqueues.api.sqs.attributes import (
    ANSWERED,
    COUNTED,
    DEFAULTS,
    FIFO_DEFAULTS,
    NO_REDRIVE,
    SQS_CONSUMER,
    VISIBILITY_MAX_S,
    Changes,
    check_queue_name,
    is_fifo,
    parse_changes,
    queue_arn,
    requested,
)
from vqueues.api.sqs.handles import decode_handle
from vqueues.api.sqs.messages import (
    Outgoing,
    attribute_filter,
    message_id_of,
    outgoing,
    received,
    system_names,
)
from vqueues.api.sqs.paths import ANSWER_JSON, FORWARDED_HOST, FORWARDED_PROTO
from vqueues.api.sqs.protocol import SqsError
from vqueues.api.sqs.signatures import key_id_of
from vqueues.errors import Conflict, Unavailable
from vqueues.queues.service import QueueService
from vqueues.records import Record, now_ms
from vqueues.results import ConsumerSettings, LeasedRecord
from vqueues.settings import MIN_VISIBILITY_MS, Settings
from vqueues.work.work_service import WorkService

MAX_BATCH = 10
MAX_BATCH_BYTES = 1_048_576
MAX_LIST = 1000
MAX_WAIT_S = 20
MAX_MESSAGES = 10
_TOKEN = re.compile(r"[A-Za-z0-9_-]+={0,2}")


@dataclass(slots=True)
class Call:
    """One SQS call: the node's services, and the endpoint its queue URLs start with."""

    request: web.Request
    endpoint: str
    forwarded: bool = False  # sent on by another node: answered from this node alone

    @property
    def app(self) -> web.Application:
        return self.request.app

    @property
    def work(self) -> WorkService:
        return self.app[WORK]

    @property
    def service(self) -> QueueService:
        return self.app[SERVICE]

    @property
    def settings(self) -> Settings:
        return self.app[SETTINGS]

    @property
    def attempts(self) -> ReceiveAttempts:
        return self.app[SQS_ATTEMPTS]

    def url(self, queue: str) -> str:
        return f"{self.endpoint}/{self.settings.sqs_account_id}/{queue}"

    def arn(self, queue: str) -> str:
        return queue_arn(self.settings.sqs_region, self.settings.sqs_account_id, queue)

    @property
    def sender(self) -> str | None:
        """The SenderId of what this call sends: the access key id it was signed with
        (verified with auth on, as given with auth off); None for an unsigned call."""
        return key_id_of(self.request.headers.get("Authorization", ""))

    def existing(self, queue: str) -> dict[str, str]:
        """The queue's kept attributes; QueueDoesNotExist if it is no SQS queue."""
        kept = self.work.configs.attributes_of(queue, SQS_CONSUMER)
        if kept is None:
            raise SqsError("QueueDoesNotExist", "The specified queue does not exist.")
        return kept


def queue_of_url(body: Mapping[str, Any]) -> str:
    """The queue a call's QueueUrl names: its path's last segment (any node, any endpoint)."""
    url = body.get("QueueUrl")
    if not isinstance(url, str) or not url:
        raise SqsError("MissingParameter", "The request must contain the parameter QueueUrl.")
    name = urlsplit(url).path.rstrip("/").rsplit("/", 1)[-1]
    try:
        return check_queue_name(name)
    except SqsError:
        raise SqsError("QueueDoesNotExist", "The specified queue does not exist.") from None


def _visibility_ms(seconds: int) -> int:
    """SQS's visibility timeout as a lease's: 0 s is the shortest lease vqueues grants."""
    return max(MIN_VISIBILITY_MS, seconds * 1000)


def _integer(body: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SqsError("InvalidParameterValue", f"Value {value} for parameter {name} is "
                       f"invalid. Reason: must be between {low} and {high}.")
    return value


# Queues ----------------------------------------------------------------------------------


async def create_queue(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = check_queue_name(body.get("QueueName"))
    if body.get("tags"):
        raise SqsError("UnsupportedOperation", "queue tags are not supported")
    changes = parse_changes(body.get("Attributes"), queue, creating=True)
    kept = call.work.configs.attributes_of(queue, SQS_CONSUMER)
    if kept is not None:
        current = await _answered(call, queue, kept, set(body.get("Attributes") or {}))
        given = body.get("Attributes") or {}
        differ = [k for k, v in given.items() if current.get(k) != _normal(call, k, v)]
        if differ:
            raise SqsError("QueueNameExists", "A queue already exists with the same name and "
                           f"a different value for attribute(s) {', '.join(differ)}")
        return {"QueueUrl": call.url(queue)}
    now_s = str(int(time.time()))
    new = {**DEFAULTS, **(FIFO_DEFAULTS if is_fifo(queue) else {}), **changes.kept,
           "CreatedTimestamp": now_s, "LastModifiedTimestamp": now_s}
    if changes.visibility_s is None:
        changes.visibility_s = 30
    if changes.redrive is None:
        changes.redrive = NO_REDRIVE
    await _configure(call, queue, changes, new)
    return {"QueueUrl": call.url(queue)}


def _normal(call: Call, name: str, value: str) -> str:
    """A given attribute as GetQueueAttributes would answer it."""
    if name == "RedrivePolicy" and value:
        changes = parse_changes({name: value}, "x.fifo" if ".fifo" in value else "x", False)
        dlq, count = changes.redrive or (None, 0)
        if dlq is not None:
            return _redrive_text(call.arn(""), dlq, count)
    if value.isascii() and value.isdigit():
        return str(int(value))
    return value


def _redrive_text(arn_prefix: str, dlq: str, count: int) -> str:
    return json.dumps({"deadLetterTargetArn": arn_prefix + dlq, "maxReceiveCount": count},
                      separators=(",", ":"))


async def _configure(call: Call, queue: str, changes: Changes, kept: dict[str, str]
                     ) -> ConsumerSettings:
    dlq: str | bool | None = False
    attempts = None
    if changes.redrive is not None:
        dlq, attempts = changes.redrive
    visibility = None if changes.visibility_s is None else _visibility_ms(changes.visibility_s)
    if visibility is not None and visibility > call.settings.max_visibility_ms:
        raise SqsError("InvalidAttributeValue", "VisibilityTimeout is above this node's "
                       f"max_visibility_ms ({call.settings.max_visibility_ms} ms)")
    return await call.work.configure(queue, SQS_CONSUMER, "lease", attempts, dlq, visibility,
                                     False, None, True, kept)


async def get_queue_url(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = check_queue_name(body.get("QueueName"))
    call.existing(queue)
    return {"QueueUrl": call.url(queue)}


async def delete_queue(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    call.existing(queue)
    await call.service.delete_queue(queue)
    return {}


async def purge_queue(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    call.existing(queue)
    await call.service.delete_queue(queue, keep=SQS_CONSUMER)
    return {}


def list_page(names: list[str], body: Mapping[str, Any]) -> tuple[list[str], str | None]:
    """ListQueues' page of the sorted `names`: after NextToken, at most MaxResults (without
    MaxResults: the first 1000, and no NextToken)."""
    limit = _integer(body, "MaxResults", 1, MAX_LIST)
    token = body.get("NextToken")
    if token is not None:
        try:
            if not isinstance(token, str) or not _TOKEN.fullmatch(token):
                raise ValueError(token)
            after = base64.urlsafe_b64decode(token.encode()).decode("utf-8")
        except (binascii.Error, ValueError):
            raise SqsError("InvalidParameterValue", "Invalid NextToken") from None
        names = [n for n in names if n > after]
    if limit is None:
        return names[:MAX_LIST], None
    page = names[:limit]
    more = len(names) > limit
    return page, _token(page[-1]) if more else None


def _token(last: str) -> str:
    """The NextToken of a page that ends with `last`."""
    return base64.urlsafe_b64encode(last.encode()).decode()


async def _peer_names(call: Call, url: str) -> tuple[list[str], bool]:
    """The queue names another node lists for its own partitions, and whether it has more:
    the call itself sent on (signed as it came), which that node answers from its partitions
    alone, the same page (MaxResults, NextToken) as this node's, in JSON 1.0 whatever the
    call's protocol."""
    request = call.request
    answer = await proxy(request, url, {FORWARDED_HOST: request.host,
                                        FORWARDED_PROTO: request.scheme, ANSWER_JSON: "1"})
    try:
        found = json.loads(answer.body if isinstance(answer.body, bytes) else b"")
    except ValueError:
        found = None
    if answer.status != 200 or not isinstance(found, dict):
        raise Unavailable("owner_unreachable", f"listing queues at {url} answered "
                          f"{answer.status}", owner=url)
    return ([str(u).rsplit("/", 1)[-1] for u in found.get("QueueUrls", [])],
            "NextToken" in found)


def list_prefix(body: Mapping[str, Any]) -> str:
    prefix = body.get("QueueNamePrefix") or ""
    if not isinstance(prefix, str):
        raise SqsError("InvalidParameterValue", "QueueNamePrefix must be a string")
    return prefix


async def list_queues(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    """The SQS queues of the whole cluster: this node's, and those each other node of the
    cluster map answers for its own partitions (a call another node sent on: this node's)."""
    prefix = list_prefix(body)
    list_page([], body)  # MaxResults and NextToken checked here, before any node is asked
    ownership = call.service.ownership
    owners = ownership.cluster_map.owners
    if not call.forwarded and len(set(owners) | set(ownership.states)) < ownership.partitions:
        raise Unavailable("partition_unavailable", "a partition has no owner (a rebalance is "
                          "under way): the listing would miss its queues; retry shortly")
    if any(not s.ready.is_set() for s in ownership.states.values()):
        raise Unavailable("partition_replaying", "a partition of this node is still being "
                          "replayed; retry shortly")
    names = call.work.configs.with_attributes(SQS_CONSUMER, prefix)
    peers_have_more = False
    if not call.forwarded:
        me = ownership.node_id
        peers = sorted({o.url.rstrip("/") for o in owners.values() if o.node != me})
        for found, more in await asyncio.gather(*(_peer_names(call, url) for url in peers)):
            names += found
            peers_have_more |= more
        names.sort()
    page, token = list_page(names, body)
    if token is None and peers_have_more and page:
        # A node answered a page and has more after it (the names it answered are its
        # first ones, so this page is right; what follows it is left for the next).
        token = _token(page[-1])
    out: dict[str, Any] = {"QueueUrls": [call.url(n) for n in page]}
    if token is not None:
        out["NextToken"] = token
    return out


async def get_queue_attributes(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    kept = call.existing(queue)
    names = requested(body.get("AttributeNames"))
    found = await _answered(call, queue, kept, names)
    return {"Attributes": found} if found else {}


async def _answered(call: Call, queue: str, kept: dict[str, str], names: set[str]
                    ) -> dict[str, str]:
    if not names:
        return {}
    settings = call.work.consumer_settings(queue, SQS_CONSUMER)
    values = dict(kept)
    values["VisibilityTimeout"] = str(settings.visibility_ms // 1000)
    values["QueueArn"] = call.arn(queue)
    if settings.dead_letter_queue is not None:
        values["RedrivePolicy"] = _redrive_text(call.arn(""), settings.dead_letter_queue,
                                                settings.max_attempts)
    if names & set(COUNTED):
        info = call.service.queue_info(queue)
        mine = next((c for c in info.consumers if c.consumer == SQS_CONSUMER), None)
        if mine is not None:
            values[COUNTED[0]] = str(mine.available)
            values[COUNTED[1]] = str(mine.in_flight)
            values[COUNTED[2]] = str(mine.delayed + info.scheduled)
    return {n: values[n] for n in ANSWERED if n in names and n in values}


async def set_queue_attributes(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    kept = call.existing(queue)
    if body.get("Attributes") is None:
        raise SqsError("MissingParameter", "The request must contain the parameter "
                       "Attributes.")
    changes = parse_changes(body.get("Attributes"), queue, creating=False)
    kept.update(changes.kept)
    kept["LastModifiedTimestamp"] = str(int(time.time()))
    await _configure(call, queue, changes, kept)
    return {}


# Messages --------------------------------------------------------------------------------


async def _enqueue(call: Call, queue: str, out: list[Outgoing]) -> list[str | None]:
    """Enqueue the messages; each one's SequenceNumber (a FIFO queue's). A deduplication id
    seen within the idempotency window answers the first message's MessageId (set in `out`)
    and writes nothing, whatever the body, as SQS does."""
    _charge(call, queue, out)
    if not is_fifo(queue):
        await call.service.enqueue(queue, [o.record for o in out])
        return [None] * len(out)
    sequence: list[str | None] = []
    for o in out:  # one at a time: a repeated id must not refuse the others
        try:
            result = await call.service.enqueue(queue, [o.record])
            offset = result.offsets[0] if result.offsets else None
        except Conflict as exc:
            if exc.code != "idempotency_key_reused":
                raise
            first = exc.details.get("first_offset")
            offset = first if isinstance(first, int) else None
            if offset is not None:
                o.message_id = await _message_id_at(call, queue, offset)
        sequence.append(None if offset is None else str(offset))
    return sequence


def _charge(call: Call, queue: str, out: list[Outgoing]) -> None:
    """Charge the sends to the quota of the queue's prefix (docs/security.md), as a native
    enqueue is; RequestThrottled (which SDKs retry) if it is used up."""
    quotas = call.app.get(QUOTAS)
    if quotas is None:
        return
    nbytes = sum(len(v or b"") + sum(len(k) + len(h) for k, h in hs)
                 for v, hs in (o.record for o in out))
    refused = quotas.quotas.charge(queue, len(out), nbytes)
    if refused is not None:
        call.service.metrics.quota_refusals.labels(refused.prefix).inc()
        raise SqsError("RequestThrottled", f"the enqueue quota of prefix {refused.prefix!r} "
                       f"({refused.limit}) is used up; retry in {refused.retry_after_s} s")


async def _message_id_at(call: Call, queue: str, offset: int) -> str:
    p = call.service.partition_of(queue)
    for record in await call.service.reader.resolve(p, [offset]):
        return message_id_of(queue, record)
    return message_id_of(queue, Record(offset, 0, None, ()))


def _sent(o: Outgoing, sequence: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"MessageId": o.message_id, "MD5OfMessageBody": o.md5_body}
    if o.md5_attributes is not None:
        out["MD5OfMessageAttributes"] = o.md5_attributes
    if o.md5_system is not None:
        out["MD5OfMessageSystemAttributes"] = o.md5_system
    if sequence is not None:
        out["SequenceNumber"] = sequence
    return out


async def send_message(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    kept = call.existing(queue)
    o = outgoing(body, queue, kept, call.sender)
    sequence = await _enqueue(call, queue, [o])
    return _sent(o, sequence[0])


def _entries(body: Mapping[str, Any], field: str) -> list[Mapping[str, Any]]:
    """A batch's entries: 1 to 10, each with a distinct Id of [A-Za-z0-9_-]{1,80}."""
    entries = body.get(field)
    if entries is None:
        raise SqsError("MissingParameter", f"The request must contain the parameter {field}.")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise SqsError("InvalidParameterValue", f"{field} must be a list of entries")
    if not entries:
        raise SqsError("EmptyBatchRequest", "There should be at least one "
                       "SendMessageBatchRequestEntry in the request.")
    if len(entries) > MAX_BATCH:
        raise SqsError("TooManyEntriesInBatchRequest", f"Maximum number of entries per "
                       f"request are {MAX_BATCH}. You have sent {len(entries)}.")
    ids = [e.get("Id") for e in entries]
    for i in ids:
        if not isinstance(i, str) or not 1 <= len(i) <= 80 or not all(
                c.isascii() and (c.isalnum() or c in "-_") for c in i):
            raise SqsError("InvalidBatchEntryId", "A batch entry id can only contain "
                           "alphanumeric characters, hyphens and underscores. It can be at "
                           "most 80 letters long.")
    if len(set(ids)) != len(ids):
        raise SqsError("BatchEntryIdsNotDistinct", "Two or more batch entries in the request "
                       "have the same Id.")
    return entries


def _failed(entry_id: str, error: SqsError) -> dict[str, Any]:
    return {"Id": entry_id, "SenderFault": error.sender_fault, "Code": error.code,
            "Message": error.message}


async def send_message_batch(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    kept = call.existing(queue)
    entries = _entries(body, "Entries")
    if sum(len(str(e.get("MessageBody", "")).encode()) for e in entries) > MAX_BATCH_BYTES:
        raise SqsError("BatchRequestTooLong", f"Batch requests cannot be longer than "
                       f"{MAX_BATCH_BYTES} bytes.")
    good: list[tuple[str, Outgoing]] = []
    failed = []
    sender = call.sender
    for e in entries:
        try:
            good.append((e["Id"], outgoing(e, queue, kept, sender)))
        except SqsError as exc:
            failed.append(_failed(e["Id"], exc))
    sequence = await _enqueue(call, queue, [o for _, o in good]) if good else []
    return {"Successful": [{"Id": i, **_sent(o, s)}
                           for (i, o), s in zip(good, sequence, strict=True)],
            "Failed": failed}


async def receive_message(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    kept = call.existing(queue)
    count = _integer(body, "MaxNumberOfMessages", 1, MAX_MESSAGES) or 1
    visibility = _integer(body, "VisibilityTimeout", 0, VISIBILITY_MAX_S)
    wait = _integer(body, "WaitTimeSeconds", 0, MAX_WAIT_S)
    if wait is None:
        wait = int(kept.get("ReceiveMessageWaitTimeSeconds", "0"))
    system = system_names(body)
    wanted = attribute_filter(body.get("MessageAttributeNames"))
    visibility_ms = None if visibility is None else _visibility_ms(visibility)
    attempt_id = body.get("ReceiveRequestAttemptId")
    if attempt_id is not None and is_fifo(queue):  # a standard queue ignores it, as SQS
        attempt_id = check_attempt_id(attempt_id)
        records = await _receive_again(call, queue, attempt_id, visibility_ms)
    else:
        attempt_id = records = None
    if records is None:
        records = (await call.work.lease(queue, SQS_CONSUMER, count, visibility_ms,
                                         wait * 1000)).records
        if attempt_id is not None:
            call.attempts.keep(queue, attempt_id, Attempt(now_ms(), [
                Answered(r.record.offset, r.token, r.attempt, r.deadline, r.first_leased)
                for r in records]))
    s = call.settings
    return {"Messages": [received(queue, r, system, wanted, s.sqs_region, s.sqs_account_id)
                         for r in records]}


async def _receive_again(call: Call, queue: str, attempt_id: str, visibility_ms: int | None
                         ) -> list[LeasedRecord] | None:
    """What the receive with this ReceiveRequestAttemptId answered (within five minutes),
    with the same receipt handles and their visibility timeout reset, while every message
    is still leased as it was answered: not deleted, its visibility neither changed nor run
    out. None otherwise: the call is a new receive."""
    attempts = call.attempts
    now = now_ms()
    kept = attempts.get(queue, attempt_id, now)
    if kept is None:
        return None
    tokens = [m.token for m in kept.messages]
    deadlines = call.work.lease_deadlines(queue, SQS_CONSUMER, tokens)
    if any(d is None or d != m.deadline or d <= now
           for d, m in zip(deadlines, kept.messages, strict=True)):
        attempts.forget(queue, attempt_id)
        return None
    found = {r.offset: r for r in await call.service.reader.resolve(
        call.service.partition_of(queue), [m.offset for m in kept.messages])}
    if visibility_ms is None:
        visibility_ms = call.work.consumer_settings(queue, SQS_CONSUMER).visibility_ms
    until = None
    if len(found) == len(kept.messages):  # else retention removed one meanwhile
        try:
            until = (await call.work.extend(queue, SQS_CONSUMER, tokens, visibility_ms)
                     ).deadline
        except Conflict as exc:  # a message changed meanwhile
            if exc.code != "lease_expired":
                raise
    if until is None:
        attempts.forget(queue, attempt_id)
        return None
    # The window's deadlines as they are now, not `until`: two retries of one id in flight
    # may resume in another order than their extends were applied.
    for m, now_until in zip(kept.messages, call.work.lease_deadlines(
            queue, SQS_CONSUMER, tokens), strict=True):
        m.deadline = now_until if now_until is not None else until
    return [LeasedRecord(found[m.offset], m.token, m.attempt, until, m.first)
            for m in kept.messages]


def _handle(queue: str, handle: object) -> str:
    """The lease token of a receipt handle given for `queue`."""
    decoded = decode_handle(handle)
    if decoded is None or decoded[0] != queue:
        raise SqsError("ReceiptHandleIsInvalid", f"The input receipt handle {handle!r} is "
                       "not a valid receipt handle.")
    return decoded[1]


async def _complete(call: Call, queue: str, tokens: list[str]) -> None:
    """Complete what is current; a handle superseded by a later receive, or for a message
    done already, changes nothing and is no error (SQS's DeleteMessage)."""
    while tokens:
        try:
            await call.work.complete(queue, SQS_CONSUMER, tokens)
            return
        except Conflict as exc:
            if exc.code != "lease_expired":
                raise
            stale = set(exc.details.get("stale") or tokens)
            tokens = [t for t in tokens if t not in stale]


async def delete_message(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    call.existing(queue)
    if body.get("ReceiptHandle") is None:
        raise SqsError("MissingParameter", "The request must contain the parameter "
                       "ReceiptHandle.")
    await _complete(call, queue, [_handle(queue, body.get("ReceiptHandle"))])
    return {}


async def delete_message_batch(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    call.existing(queue)
    entries = _entries(body, "Entries")
    tokens, ok, failed = [], [], []
    for e in entries:
        try:
            tokens.append(_handle(queue, e.get("ReceiptHandle")))
            ok.append({"Id": e["Id"]})
        except SqsError as exc:
            failed.append(_failed(e["Id"], exc))
    await _complete(call, queue, list(dict.fromkeys(tokens)))
    return {"Successful": ok, "Failed": failed}


async def _change_visibility(call: Call, queue: str, handle: object, seconds: Any) -> None:
    token = _handle(queue, handle)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or \
            not 0 <= seconds <= VISIBILITY_MAX_S:
        raise SqsError("InvalidParameterValue", f"Value {seconds} for parameter "
                       f"VisibilityTimeout is invalid. Reason: must be between 0 and "
                       f"{VISIBILITY_MAX_S}.")
    try:
        if seconds == 0:  # visible again now: given back, due at once
            await call.work.retry(queue, SQS_CONSUMER, [token], 0, "visibility set to 0")
        else:
            await call.work.extend(queue, SQS_CONSUMER, [token], seconds * 1000)
    except Conflict as exc:
        if exc.code != "lease_expired":
            raise
        raise SqsError("MessageNotInflight", "The message referred to isn't in flight: its "
                       "receipt handle was superseded by a later receive, or it was "
                       "deleted.") from None


async def change_message_visibility(call: Call, body: Mapping[str, Any]) -> dict[str, Any]:
    queue = queue_of_url(body)
    call.existing(queue)
    await _change_visibility(call, queue, body.get("ReceiptHandle"),
                             body.get("VisibilityTimeout"))
    return {}


async def change_message_visibility_batch(call: Call, body: Mapping[str, Any]
                                          ) -> dict[str, Any]:
    queue = queue_of_url(body)
    call.existing(queue)
    ok, failed = [], []
    for e in _entries(body, "Entries"):
        try:
            await _change_visibility(call, queue, e.get("ReceiptHandle"),
                                     e.get("VisibilityTimeout"))
            ok.append({"Id": e["Id"]})
        except SqsError as exc:
            failed.append(_failed(e["Id"], exc))
    return {"Successful": ok, "Failed": failed}


Action = Callable[[Call, Mapping[str, Any]], Awaitable[dict[str, Any]]]
ACTIONS: dict[str, Action] = {
    "CreateQueue": create_queue, "GetQueueUrl": get_queue_url, "ListQueues": list_queues,
    "DeleteQueue": delete_queue, "PurgeQueue": purge_queue,
    "GetQueueAttributes": get_queue_attributes, "SetQueueAttributes": set_queue_attributes,
    "SendMessage": send_message, "SendMessageBatch": send_message_batch,
    "ReceiveMessage": receive_message, "DeleteMessage": delete_message,
    "DeleteMessageBatch": delete_message_batch,
    "ChangeMessageVisibility": change_message_visibility,
    "ChangeMessageVisibilityBatch": change_message_visibility_batch,
}
# Actions of SQS's API that vqueues does not do: UnsupportedOperation (any other name is
# InvalidAction).
UNSUPPORTED = ("AddPermission", "RemovePermission", "TagQueue", "UntagQueue", "ListQueueTags",
               "ListDeadLetterSourceQueues", "StartMessageMoveTask", "CancelMessageMoveTask",
               "ListMessageMoveTasks")
# Actions that change lease state or settings: refused while the node may have stood still
# (the self-fence, as the native routes that write the offset topic are). Sends are not, as
# native enqueues are not.
FENCED = frozenset(("CreateQueue", "DeleteQueue", "PurgeQueue", "SetQueueAttributes",
                    "ReceiveMessage", "DeleteMessage", "DeleteMessageBatch",
                    "ChangeMessageVisibility", "ChangeMessageVisibilityBatch"))

# The scope (docs/security.md) each action needs on its queue, as the native routes': read
# to receive and settle, write to send, admin to make, change, purge, delete and list queues.
SCOPES = {"SendMessage": "write", "SendMessageBatch": "write",
          "ReceiveMessage": "read", "DeleteMessage": "read", "DeleteMessageBatch": "read",
          "ChangeMessageVisibility": "read", "ChangeMessageVisibilityBatch": "read",
          "GetQueueAttributes": "read", "GetQueueUrl": "read",
          "CreateQueue": "admin", "SetQueueAttributes": "admin", "PurgeQueue": "admin",
          "DeleteQueue": "admin", "ListQueues": "admin"}


def required_scope(name: str, body: Mapping[str, Any]) -> tuple[str, str]:
    """(scope, queue name or, for ListQueues, the prefix) a call needs."""
    if name == "ListQueues":
        return "admin", list_prefix(body)
    if name in ("CreateQueue", "GetQueueUrl"):
        return SCOPES[name], check_queue_name(body.get("QueueName"))
    return SCOPES[name], queue_of_url(body)
