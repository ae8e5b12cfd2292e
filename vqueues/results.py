"""What the service answers: typed results. Only the HTTP layer turns them into JSON (and the
OpenAPI document takes their schemas from these same types). Those made on every request are
msgspec Structs, made many times faster than frozen dataclasses (ADR 15)."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from vqueues.records import Record


class EnqueueResult(msgspec.Struct, frozen=True, gc=False):
    partition: int
    offsets: list[int] | None  # None when the node writes with acks=0


class ReadResult(msgspec.Struct, frozen=True, gc=False):
    partition: int
    records: list[Record]
    next_offset: int


@dataclass(slots=True, frozen=True)
class AckResult:
    queue: str
    consumer: str
    offset: int
    previous_offset: int | None


@dataclass(slots=True, frozen=True)
class ConsumerDeletion:
    queue: str
    consumer: str
    deleted: bool
    offset: int  # the consumer's committed offset when it was deleted


@dataclass(slots=True, frozen=True)
class ConsumerInfo:
    consumer: str
    offset: int  # committed offset (a lease consumer's low-water mark)
    lag: int  # records at or after `offset`
    mode: str = "cursor"
    in_flight: int = 0  # leased now
    delayed: int = 0  # retried, not due yet
    available: int = 0  # could be leased now (a cursor consumer: its lag)
    dead_lettered: int = 0  # records that went past max_attempts


@dataclass(slots=True, frozen=True)
class ConsumerSettings:
    queue: str
    consumer: str
    mode: str
    max_attempts: int
    dead_letter_queue: str | None
    visibility_ms: int
    offset: int | None  # committed offset (None: nothing committed yet)
    max_in_flight: int | None = None  # records leased at once, at most (None: no cap)
    prefix: str | None = None  # the settings came from the prefix consumer over this prefix
    durable_grants: bool = False  # a lease answers once its grants are written (ADR 16)


class LeasedRecord(msgspec.Struct, frozen=True, gc=False):
    record: Record
    token: str  # names this delivery: complete, retry and extend take it
    attempt: int  # 1 on the first delivery
    deadline: int  # the lease ends then (UTC epoch ms) unless extended
    # When the record was first leased (UTC epoch ms), as far as its owner knows: the first
    # lease since it took the partition over for a record leased before that.
    first_leased: int = 0


class RefusedToken(msgspec.Struct, frozen=True, gc=False):
    """A token a lease call was given to complete and did not: `lease_expired` (not current)
    or `invalid_token` (not a token)."""

    token: str
    code: str


class LeaseResult(msgspec.Struct, frozen=True, gc=False):
    partition: int
    records: list[LeasedRecord]
    # The tokens the call completed (or found done) and refused; None: it was given none.
    completed: list[str] | None = None
    refused: list[RefusedToken] | None = None


class CompletedTokens(msgspec.Struct, frozen=True, gc=False):
    """What the completions a stream's credit carried did, token by token (ADR 16)."""

    completed: list[str]  # completed, or found done already
    refused: list[RefusedToken]


class SettleResult(msgspec.Struct, frozen=True, gc=False):
    """What complete, retry or extend did, token by token."""

    queue: str
    consumer: str
    done: list[str]  # the tokens acted on
    dead_lettered: list[str]  # (retry) tokens past max_attempts: sent to the dead letters
    offset: int  # the consumer's committed offset (low-water mark) after the call
    deadline: int | None = None  # (extend) the new lease deadline


@dataclass(slots=True, frozen=True)
class QueueInfo:
    queue: str
    partition: int
    records: int
    first_offset: int | None
    last_offset: int | None
    consumers: list[ConsumerInfo]
    scheduled: int = 0  # records waiting for their due time
    next_due: int | None = None  # the earliest of their due times (UTC epoch ms)


@dataclass(slots=True, frozen=True)
class ScheduledCancellation:
    queue: str
    id: int
    cancelled: bool


@dataclass(slots=True, frozen=True)
class QueueDeletion:
    queue: str
    deleted: bool
    partition: int
    records: int
    consumers: list[str]
    deleted_before: int


@dataclass(slots=True, frozen=True)
class QueueSummary:
    """One queue in a listing asked with `stats=true`."""

    queue: str
    partition: int
    records: int
    first_offset: int | None
    last_offset: int | None
    consumers: int
    max_lag: int  # the lag of the consumer furthest behind (0 without consumers)


@dataclass(slots=True, frozen=True)
class QueueList:
    queues: list[str]
    next_after: str | None
    stats: list[QueueSummary] | None = None  # with `stats=true`: one per name, in order


@dataclass(slots=True, frozen=True)
class OwnerInfo:
    node: str
    url: str


@dataclass(slots=True, frozen=True)
class PartitionDetail:
    """One partition this node owns: readiness and replay progress."""

    partition: int
    ready: bool
    queues: int  # queues held (with a retained record or a consumer)
    log_start: int  # the first retained offset, as last learnt
    next_offset: int  # the next data offset the tail delivers (the end once ready)
    replay_target: int | None  # the end seen at assignment: replay is done past it


@dataclass(slots=True, frozen=True)
class NodeLimits:
    """The node's request limits a client sizes its requests by (its settings)."""

    max_body_bytes: int
    max_batch_records: int
    max_record_bytes: int


@dataclass(slots=True, frozen=True)
class PartitionsInfo:
    partitions: int
    generation: int
    owners: dict[str, OwnerInfo]
    node: str
    url: str
    owned: list[int]
    ready: list[int]
    limits: NodeLimits
    details: list[PartitionDetail] = field(default_factory=list)
    layout: int = 0  # the layout `partitions` and `owners` describe (ADR 19)


class PrefixLeased(msgspec.Struct, frozen=True, gc=False):
    """A record a prefix lease handed out: its queue and partition, and the lease."""

    queue: str
    partition: int
    leased: LeasedRecord


class PrefixRefusedToken(msgspec.Struct, frozen=True, gc=False):
    """A token a prefix lease was given to complete and did not (`RefusedToken`'s codes, and
    `wrong_node` for a queue whose partition this node does not serve)."""

    queue: str
    token: str
    code: str


class PrefixLeaseResult(msgspec.Struct, frozen=True, gc=False):
    consumer: str
    records: list[PrefixLeased]
    # The {queue, token} pairs the call completed (or found done) and refused; None: none given.
    completed: list[PrefixToken] | None = None
    refused: list[PrefixRefusedToken] | None = None


class PrefixToken(msgspec.Struct, frozen=True, gc=False):
    queue: str
    token: str


class PrefixSettleResult(msgspec.Struct, frozen=True, gc=False):
    """A complete, retry or extend across queues: what it did on each queue."""

    consumer: str
    queues: list[SettleResult]


@dataclass(slots=True, frozen=True)
class PrefixConsumerInfo:
    """A prefix consumer's settings, and on the node that answers: the queues under the prefix
    it has leased from, those waiting for their turn now, its records in flight and its
    backlog."""

    consumer: str
    prefix: str
    max_attempts: int
    visibility_ms: int
    dead_letter_queue: str | None  # a queue, or a name with {queue} in it: one per queue
    max_in_flight: int | None  # per queue
    weights: dict[str, int]
    records_per_turn: int
    queues: int
    ready_queues: int
    in_flight: int
    backlog: int  # records not done (in flight, delayed, available) in this node's queues
    durable_grants: bool = False  # its queues' leases answer once their grants are written
