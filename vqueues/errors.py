"""One error registry: every code the API can return, declared once with its HTTP status, whether
a client may retry it, and one line of meaning.

`VQError(code, message, **details)` takes its status and retriable flag from the registry; the HTTP
layer renders it as `{"error": {"code", "message", "retriable", ...details}}`. docs/api.md lists
exactly these codes (a unit test checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ErrorSpec:
    status: int
    retriable: bool
    meaning: str


def _e(status: int, retriable: bool, meaning: str) -> ErrorSpec:
    return ErrorSpec(status, retriable, meaning)


REGISTRY: dict[str, ErrorSpec] = {
    # 400: the request is wrong; retrying it unchanged cannot succeed.
    "malformed_json": _e(400, False, "the body is not a JSON object"),
    "invalid_records": _e(400, False, "`records` is missing, empty or not an array"),
    "invalid_record": _e(400, False, "a record has a bad value, encoding, header or unknown field"),
    "too_many_records": _e(400, False, "more records in one request than `max_batch_records`"),
    "invalid_name": _e(400, False, "a queue or consumer name is empty, over 249 UTF-8 bytes, "
                                   "or has control characters"),
    "invalid_parameter": _e(400, False, "a parameter has the wrong type or an unknown value"),
    "limit_out_of_range": _e(400, False, "an integer parameter is outside its documented range, "
                                         "or a list is longer than its limit (a lease's "
                                         "`complete`, over 10,000 tokens)"),
    "invalid_offset": _e(400, False, "an ack's offset is missing, not an integer, or negative"),
    "offset_out_of_range": _e(400, False, "an ack's offset is past the partition's end"),
    "invalid_token": _e(400, False, "a lease token is missing or not a token"),
    "missing_field": _e(400, False, "(compat routes) a required field is missing"),
    "bad_request": _e(400, False, "the HTTP request itself is malformed"),
    # 401, 403: who is calling, and may they.
    "unauthenticated": _e(401, False, "auth is on and the request has no valid bearer token"),
    "forbidden": _e(403, False, "the token is valid but has no scope for this call on this "
                                "queue"),
    # 404, 405, 408, 415: nothing there, or not in a form the node takes.
    "not_found": _e(404, False, "no such route"),
    "queue_not_found": _e(404, False, "the queue has no records and no consumers"),
    "scheduled_not_found": _e(404, False, "the queue has no such record waiting for its due time"),
    "consumer_not_found": _e(404, False, "the queue has no such consumer"),
    "prefix_consumer_not_found": _e(404, False, "no prefix consumer by that name"),
    "method_not_allowed": _e(405, False, "the route does not take this method"),
    "unsupported_media_type": _e(415, False, "the body's content type is not accepted"),
    "request_timeout": _e(408, True, "the request body did not arrive within "
                                     "`body_timeout_ms`"),
    # 409: the state does not allow it (wrong_node: ask the owner instead).
    "wrong_node": _e(409, True, "another node owns the queue's partition; `owner` names it"),
    "rewind_not_allowed": _e(409, False, "an ack below the committed offset without "
                                         "`allow_rewind`"),
    "lease_expired": _e(409, False, "a token's lease is not current: it expired and the record "
                                    "was leased again, or the token never existed; for retry "
                                    "and extend also a record that was completed (completing a "
                                    "completed record again answers 200)"),
    "idempotency_key_reused": _e(409, False, "a record's idempotency key was seen for this queue "
                                             "within the window, or earlier in the request, "
                                             "with a different payload; nothing was written"),
    "consumer_mode_mismatch": _e(409, False, "a lease call on a cursor consumer, or an ack on a "
                                             "lease consumer (see its `mode`)"),
    # 413: too big.
    "payload_too_large": _e(413, False, "the body is over `max_body_bytes`"),
    "record_too_large": _e(413, False, "a decoded record value is over `max_record_bytes`"),
    # 429: a tenant's quota; retry after `Retry-After`.
    "quota_exceeded": _e(429, True, "the enqueue quota of the queue's prefix (its tenant) is "
                                    "used up on this node; nothing was written"),
    # 503: temporary; retry after `Retry-After`.
    "partition_replaying": _e(503, True, "the partition is still being replayed"),
    "partition_unavailable": _e(503, True, "no node owns the queue's partition now, as far as "
                                           "this node knows (a rebalance is under way), or "
                                           "this node stood still and has not confirmed it "
                                           "still owns it (self_fence_ms)"),
    "broker_error": _e(503, True, "a Kafka operation failed"),
    "broker_timeout": _e(503, True, "Kafka did not answer in time"),
    "broker_unreachable": _e(503, True, "no Kafka broker answered"),
    "producer_queue_full": _e(503, True, "the node's Kafka producer queue is full"),
    "owner_unreachable": _e(503, True, "(with --forward) the owner did not answer"),
    # 500: a bug, logged with its traceback.
    "internal": _e(500, False, "an unexpected error; the node logged it"),
}


class VQError(Exception):
    """Base of every client-visible error; `code` must be in REGISTRY."""

    code = "internal"

    def __init__(self, code: str | None = None, message: str = "", **details: Any) -> None:
        code = code or self.code
        spec = REGISTRY.get(code)
        if spec is None:
            raise KeyError(f"error code {code!r} is not in the registry")
        super().__init__(message or code)
        self.code = code
        self.status = spec.status
        self.retriable = spec.retriable
        self.message = message or spec.meaning
        self.details = details

    def to_json(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message,
                          "retriable": self.retriable, **self.details}}


class BadRequest(VQError):
    code = "invalid_parameter"


class NotFound(VQError):
    code = "not_found"


class Conflict(VQError):
    code = "rewind_not_allowed"


class WrongNode(VQError):
    """The queue's partition is owned by another node (or none)."""

    code = "wrong_node"


class PayloadTooLarge(VQError):
    code = "payload_too_large"


class Unavailable(VQError):
    """Temporarily unable to serve (partition replaying, broker unreachable)."""

    code = "broker_error"

    def __init__(self, code: str | None = None, message: str = "", retry_after_s: int = 1,
                 **details: Any) -> None:
        super().__init__(code, message, **details)
        self.retry_after_s = retry_after_s


class BrokerError(Unavailable):
    """A Kafka operation failed; translated at the Kafka adapter's edge."""

    code = "broker_error"


class ConfigError(Exception):
    """Settings or topic layout that a node cannot start with."""
