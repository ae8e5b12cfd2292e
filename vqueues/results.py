"""What the service answers: typed results. Only the HTTP layer turns them into JSON (and the
OpenAPI document takes their schemas from these same types)."""

from __future__ import annotations

from dataclasses import dataclass

from vqueues.records import Record


@dataclass(slots=True, frozen=True)
class EnqueueResult:
    partition: int
    offsets: list[int] | None  # None when the node writes with acks=0


@dataclass(slots=True, frozen=True)
class ReadResult:
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
    offset: int
    lag: int  # records at or after `offset`


@dataclass(slots=True, frozen=True)
class QueueInfo:
    queue: str
    partition: int
    records: int
    first_offset: int | None
    last_offset: int | None
    consumers: list[ConsumerInfo]


@dataclass(slots=True, frozen=True)
class QueueDeletion:
    queue: str
    deleted: bool
    partition: int
    records: int
    consumers: list[str]
    deleted_before: int


@dataclass(slots=True, frozen=True)
class QueueList:
    queues: list[str]
    next_after: str | None


@dataclass(slots=True, frozen=True)
class OwnerInfo:
    node: str
    url: str


@dataclass(slots=True, frozen=True)
class PartitionsInfo:
    partitions: int
    generation: int
    owners: dict[str, OwnerInfo]
    node: str
    url: str
    owned: list[int]
    ready: list[int]
