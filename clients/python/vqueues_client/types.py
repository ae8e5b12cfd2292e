"""What the client's calls take and answer: records, leases, and each call's result."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from vqueues_client.errors import VQError

Value = bytes | str | None


@dataclass(frozen=True, slots=True)
class Record:
    offset: int
    timestamp: int
    value: bytes | None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str | None:
        return None if self.value is None else self.value.decode("utf-8")


@dataclass(frozen=True, slots=True)
class Lease:
    """A leased record: complete, retry or extend it by `token` before `deadline`. A prefix
    lease says which `queue` (and `partition`) each record came from."""

    record: Record
    token: str
    attempt: int  # 1 on the first delivery
    deadline: int  # UTC epoch ms
    queue: str | None = None  # (prefix leases)
    partition: int | None = None  # (prefix leases)

    @property
    def offset(self) -> int:
        return self.record.offset

    @property
    def value(self) -> bytes | None:
        return self.record.value

    @property
    def headers(self) -> dict[str, str]:
        return self.record.headers

    @property
    def text(self) -> str | None:
        return self.record.text


@dataclass(frozen=True, slots=True)
class Refused:
    """A token given to a lease's `complete=` that the node did not complete, and why:
    `lease_expired` (not current: the record comes again), `invalid_token` (not a token), or,
    for a prefix lease, `wrong_node` (that queue's partition is not the node's: complete it
    with the node that leased it)."""

    token: str
    code: str
    queue: str | None = None  # (prefix leases)


C = TypeVar("C")


class LeasePage(list[Lease], Generic[C]):
    """A lease's answer: the leased records (a plain list of `Lease`, as without `complete=`)
    and what each token given in `complete=` did: `completed` (done, or found done already) and
    `refused`. Both are empty without `complete=`. A prefix lease names its tokens with their
    queue: `completed` holds `(queue, token)` pairs there."""

    def __init__(self, leases: Iterable[Lease] = (), completed: list[C] | None = None,
                 refused: list[Refused] | None = None) -> None:
        super().__init__(leases)
        self.completed: list[C] = completed or []
        self.refused: list[Refused] = refused or []


@dataclass(frozen=True, slots=True)
class ReadResult:
    partition: int
    records: list[Record]
    next_offset: int


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    partition: int
    offsets: list[int] | None


@dataclass(frozen=True, slots=True)
class RecordResult:
    """One record of a multi-queue enqueue: where it was written, or why it was not."""

    queue: str
    partition: int
    offset: int | None  # None: failed (see `error`), or the node writes with acks=0
    error: VQError | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class NewRecord:
    """One record to enqueue with headers of its own (a batch may mix them)."""

    value: Value
    headers: dict[str, str] | None = None
    idempotency_key: str | None = None  # a repeat within the server's window writes nothing
    tags: list[str] | None = None  # indexed by the server: read/lease/stream by tag
    deliver_at: int | None = None  # UTC epoch ms: invisible until then
    delay_ms: int | None = None  # invisible for this long
