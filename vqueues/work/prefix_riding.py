"""Completions a prefix lease carries (ADR 16): decided queue by queue under the queues'
locks, which the call keeps until each partition's write is submitted, so that a partition's
completions go out in the same write as its grants."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from vqueues.errors import BadRequest
from vqueues.locks import KeyedLocks
from vqueues.ownership.ownership import Ownership
from vqueues.records import OffsetEntry
from vqueues.results import PrefixLeased, PrefixLeaseResult, PrefixRefusedToken, PrefixToken
from vqueues.state.partition_state import PartitionState
from vqueues.state.prefix_consumers import PrefixConsumer
from vqueues.state.tokens import parse_token
from vqueues.work.work_service import Riding, WorkService


async def ride(pc: PrefixConsumer, pairs: Sequence[tuple[str, str]], ownership: Ownership,
               partition_of: Callable[[str], int], locks: KeyedLocks) -> PrefixRiding:
    """The completions a prefix lease carries, decided queue by queue under the queues'
    locks (taken in one order, so no two calls wait for each other), which it keeps until
    each partition's write is submitted."""
    consumer = pc.consumer
    riding = PrefixRiding()
    by_queue: dict[str, list[str]] = {}
    for queue, token in dict.fromkeys(pairs):
        if not pc.covers(queue):
            raise BadRequest("invalid_parameter", f"queue {queue!r} is not under the "
                             f"prefix {pc.prefix!r}")
        if parse_token(token) is None:
            riding.refused.append(PrefixRefusedToken(queue, token, "invalid_token"))
        else:
            by_queue.setdefault(queue, []).append(token)
    for queue in sorted(by_queue):
        state = ownership.states.get(partition_of(queue))
        if state is None or state.revoked or not state.ready.is_set():
            riding.refused += [PrefixRefusedToken(queue, t, "wrong_node")
                               for t in by_queue[queue]]
            continue
        key = ("c", queue, consumer)
        await locks.acquire(key)
        part = riding.part(state)
        part.keys.append(key)
        work = state.windows.get((queue, consumer))
        if work is None:  # not a lease consumer here: nothing of it is current
            riding.refused += [PrefixRefusedToken(queue, t, "lease_expired")
                               for t in by_queue[queue]]
            continue
        one = Riding(by_queue[queue])
        part.entries += one.decide(state, queue, consumer, work)
        if one.count:
            part.queues[queue] = one.count
        part.done += [PrefixToken(queue, t) for t in one.done]
        riding.refused += [PrefixRefusedToken(queue, r.token, r.code) for r in one.refused]
    return riding


class RidingPart:
    """A prefix lease's completions in one partition: their entries, the queues' locks the
    call holds until they are submitted, and how many records each queue completed."""

    __slots__ = ("done", "entries", "keys", "lost", "queues", "state")

    def __init__(self, state: PartitionState) -> None:
        self.state = state
        self.entries: list[OffsetEntry] = []
        self.keys: list[tuple[str, str, str]] = []
        self.queues: dict[str, int] = {}
        self.done: list[PrefixToken] = []  # completed, or found done already
        self.lost = False  # the partition went before the part was written

    def completed(self, work: WorkService, state: PartitionState) -> None:
        """They are durable: counted, and parked leasers of their queues go on."""
        for queue, count in self.queues.items():
            work.metrics.records_completed.inc(count)
            state.wake(queue)


class PrefixRiding:
    """The completions a prefix lease carries (ADR 16), by partition: a partition the lease
    writes to takes its part (`take`) into that write; `finish` writes the rest alone."""

    def __init__(self) -> None:
        self.parts: dict[int, RidingPart] = {}
        self.answered: list[RidingPart] = []  # every part, in the answer
        self.refused: list[PrefixRefusedToken] = []

    def part(self, state: PartitionState) -> RidingPart:
        part = self.parts.get(state.partition)
        if part is None:
            part = self.parts[state.partition] = RidingPart(state)
            self.answered.append(part)
        return part

    def take(self, partition: int) -> RidingPart | None:
        return self.parts.pop(partition, None)

    async def finish(self, work: WorkService, locks: KeyedLocks) -> None:
        """The parts no lease took: each written alone, under its locks, then answered once
        durable (a failure fails the call: its completions were not answered)."""
        parts, self.parts = list(self.parts.values()), {}
        durables: list[tuple[RidingPart, Awaitable[None]]] = []
        try:
            for part in parts:
                if part.state.revoked:
                    part.lost = True
                elif part.entries:
                    durables.append((part, work.entries.submit(part.state, part.entries,
                                                               applied=True)))
        finally:
            for part in parts:
                for key in part.keys:
                    locks.release(key)
        for part, durable in durables:
            await durable
            part.completed(work, part.state)

    def answer(self) -> tuple[list[PrefixToken], list[PrefixRefusedToken]]:
        """What each token did; asked once every part was written (or found unwritten)."""
        refused = list(self.refused)
        for part in self.answered:
            if part.lost:
                refused += [PrefixRefusedToken(t.queue, t.token, "wrong_node") for t in part.done]
        return [t for part in self.answered if not part.lost for t in part.done], refused


def prefix_result(consumer: str, records: list[PrefixLeased], riding: PrefixRiding | None
                   ) -> PrefixLeaseResult:
    if riding is None:
        return PrefixLeaseResult(consumer, records)
    return PrefixLeaseResult(consumer, records, *riding.answer())
