"""Which records a lease hands out: a walk of the lease consumer's window, lowest offset first,
one record per ordering key at a time, then new records joining the window up to its limit
(docs/work-queues.md, ADR 8). Decisions on the partition's state; the records' headers (for
ordering keys and tags) are read through the queue service."""

from __future__ import annotations

from array import array

from vqueues.leases import ORDER_KEY_HEADER, ConsumerConfig, Delivery, WorkState
from vqueues.partition_state import PartitionState
from vqueues.records import Record, now_ms
from vqueues.service import QueueService
from vqueues.settings import Settings
from vqueues.tags import tags_of


def order_key(rec: Record) -> str | None:
    """The record's ordering key (`vq-ordering-key`), if it has one."""
    for name, value in rec.headers:
        if name == ORDER_KEY_HEADER and value is not None:
            return value.decode("utf-8", "replace")
    return None


def queue_offsets(state: PartitionState, queue: str) -> array[int]:
    q = state.queues.get(queue)
    return q.offsets if q is not None else array("q")


def window(state: PartitionState, queue: str, consumer: str, work: WorkState
           ) -> tuple[array[int], int]:
    """The consumer's window (the queue's offsets from its low-water mark to its frontier)
    and its committed offset."""
    committed = state.committed(queue, consumer) or 0
    return work.window(queue_offsets(state, queue), committed), committed


def exhausted(state: PartitionState, queue: str, consumer: str, work: WorkState,
              config: ConsumerConfig) -> list[int]:
    """Available records that used up their attempts (their last lease expired)."""
    now = now_ms()
    out = []
    for off in window(state, queue, consumer, work)[0]:
        d = work.deliveries.get(off)
        if d is not None and d.attempts >= config.max_attempts and d.available(now):
            out.append(off)
    return out


class LeaseChoice:
    """Chooses what a lease takes; reads records through `queues` and holds the window to the
    node's `max_lease_window`."""

    def __init__(self, settings: Settings, queues: QueueService) -> None:
        self.settings = settings
        self.queues = queues

    async def learn_keys(self, state: PartitionState, queue: str, consumer: str,
                         work: WorkState) -> None:
        """Window records never delivered (skipped for their key before a failover) get a
        Delivery with their ordering key, read from the records."""
        unknown = [o for o in window(state, queue, consumer, work)[0]
                   if o not in work.deliveries and o not in work.done]
        if unknown:
            for rec in await self.queues.resolve(state.partition, unknown):
                work.deliveries.setdefault(rec.offset, Delivery(0, 0, False, order_key(rec)))
            for off in unknown:  # gone (retention): nothing to deliver
                work.deliveries.setdefault(off, Delivery(0, 0, False, None))

    async def choose(self, state: PartitionState, queue: str, consumer: str, work: WorkState,
                     max_records: int, tag: str | None = None) -> tuple[list[int], list[int]]:
        """The offsets to lease, in offset order: first the window's available records, then
        new ones (each joins the window); a record waits while an earlier record with its
        ordering key is not done. Also the new records `tag` filters out (to complete)."""
        now = now_ms()
        busy: set[str] = set()
        chosen: list[int] = []
        held, committed = window(state, queue, consumer, work)
        for off in held:
            if off in work.done:
                continue
            d = work.deliveries[off]
            key = d.order_key
            if not d.available(now) or (key is not None and key in busy):
                if key is not None:
                    busy.add(key)
                continue
            chosen.append(off)
            if key is not None:
                busy.add(key)
            if len(chosen) >= max_records:
                return chosen, []
        skipped: list[int] = []
        room = self.settings.max_lease_window - len(held)
        while len(chosen) < max_records and room > 0:
            ahead = state.select(queue, max(work.frontier, committed),
                                 min(room, max(16, 2 * (max_records - len(chosen)))))
            if not ahead:
                break
            records = {r.offset: r for r in await self.queues.resolve(state.partition, ahead)}
            if state.revoked:
                return [], []
            for off in ahead:
                if off < work.frontier:  # another call took it meanwhile
                    continue
                rec = records.get(off)
                key = order_key(rec) if rec is not None else None
                work.deliveries[off] = Delivery(0, 0, False, key)
                work.frontier = off + 1
                room -= 1
                if tag is not None and (rec is None or tag not in tags_of(rec.headers)):
                    skipped.append(off)  # not for this consumer's filter: done as skipped
                    continue
                if rec is not None and len(chosen) < max_records and (
                        key is None or key not in busy):
                    chosen.append(off)
                if key is not None:
                    busy.add(key)
                if len(chosen) >= max_records or room <= 0:
                    break
        return chosen, skipped
