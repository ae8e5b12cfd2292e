"""The multi-queue enqueue: records for many queues in one call, each record answered on its own.

The records of one queue keep their order (they go to the broker together, in the order given).
The queues of one partition this node owns go in one produce; a queue whose records carry
idempotency keys goes through the keyed enqueue (`QueueService.enqueue`), so its keys hold
exactly as they do for a single-queue call. Every partition is written concurrently. A record
whose queue this node cannot take (another node owns its partition, none does yet, it is still
replaying, the broker failed the write) gets that error; the other records are written.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from vqueues.errors import VQError
from vqueues.queues.service import QueueService
from vqueues.records import NewRecord
from vqueues.state.idempotency import key_of
from vqueues.state.partition_state import PartitionState

# Per record: (partition, offset), offset None when the node writes with acks=0; or the error.
Outcome = tuple[int, int | None] | VQError
# A check made before anything is written for a queue (auth scopes, quotas): its refusal, if any.
QueueCheck = Callable[[str, Sequence[NewRecord]], VQError | None]


async def enqueue_many(service: QueueService, items: Sequence[tuple[str, NewRecord]],
                       check: QueueCheck | None = None) -> list[Outcome]:
    """Write `items` (queue, record); one outcome per item, in the same order."""
    batch = _Batch(service, items)
    by_partition: dict[int, list[str]] = {}
    for queue, indices in batch.by_queue.items():
        records = [items[i][1] for i in indices]
        refused = check(queue, records) if check is not None else None
        p = service.partition_of(queue)
        if refused is not None:
            batch.settle(queue, refused, p)
        else:
            by_partition.setdefault(p, []).append(queue)
    await asyncio.gather(*(batch.write_partition(p, qs) for p, qs in by_partition.items()))
    assert all(o is not None for o in batch.out)
    return [o for o in batch.out if o is not None]


class _Batch:
    """One `enqueue_many` call: its items by queue, and their outcomes as they settle."""

    def __init__(self, service: QueueService, items: Sequence[tuple[str, NewRecord]]) -> None:
        self.service = service
        self.items = items
        self.by_queue: dict[str, list[int]] = {}
        for i, (queue, _) in enumerate(items):
            self.by_queue.setdefault(queue, []).append(i)
        self.out: list[Outcome | None] = [None] * len(items)

    def records(self, queue: str) -> list[NewRecord]:
        return [self.items[i][1] for i in self.by_queue[queue]]

    def settle(self, queue: str, result: Outcome | list[int] | None, partition: int) -> None:
        indices = self.by_queue[queue]
        if isinstance(result, VQError):
            for i in indices:
                self.out[i] = result
        else:
            for n, i in enumerate(indices):
                self.out[i] = (partition, result[n] if result is not None else None)

    async def write_partition(self, p: int, queues: list[str]) -> None:
        service = self.service
        try:
            state = service.ownership.require(p)
        except VQError as exc:
            for queue in queues:
                self.settle(queue, exc, p)
            return
        plain: list[tuple[str, list[NewRecord]]] = []
        keyed: list[str] = []
        for queue in queues:
            records = self.records(queue)
            if service.settings.producer_acks != "0" and any(
                    headers and key_of(headers) for _, headers in records):
                keyed.append(queue)
            else:
                plain.append((queue, records))
        await asyncio.gather(*([self.write_plain(p, state, plain)] if plain else []),
                             *(self.write_keyed(p, q) for q in keyed))

    async def write_plain(self, p: int, state: PartitionState,
                          plain: list[tuple[str, list[NewRecord]]]) -> None:
        try:
            offsets = await self.service.append_queues(p, state, plain)
        except VQError as exc:
            for queue, _ in plain:
                self.settle(queue, exc, p)
            return
        for (queue, _), queue_offsets in zip(plain, offsets, strict=True):
            self.settle(queue, queue_offsets, p)

    async def write_keyed(self, p: int, queue: str) -> None:
        try:
            indices = self.by_queue[queue]
            result = await self.service.enqueue(queue, self.records(queue), indices)
        except VQError as exc:
            self.settle(queue, exc, p)
            return
        self.settle(queue, result.offsets, p)
