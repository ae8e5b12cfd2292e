"""Which records a lease hands out: the window's index first (records available now, lowest
offset first, one per ordering key at a time), then new records joining the window up to its
limit (docs/work-queues.md, ADR 12). Decisions on the partition's state; the records' headers
(for ordering keys and tags) are read through the queue service."""

from __future__ import annotations

from array import array

from vqueues.queues.record_reader import RecordReader
from vqueues.records import Record, now_ms
from vqueues.settings import Settings
from vqueues.state.consumer_config import ORDER_KEY_HEADER, ConsumerConfig
from vqueues.state.partition_state import PartitionState
from vqueues.state.tags import tags_of
from vqueues.state.window import Delivery, LeaseWindow


def order_key(rec: Record) -> str | None:
    """The record's ordering key (`vq-ordering-key`), if it has one."""
    for name, value in rec.headers:
        if name == ORDER_KEY_HEADER and value is not None:
            return value.decode("utf-8", "replace")
    return None


def queue_offsets(state: PartitionState, queue: str) -> array[int]:
    q = state.queues.get(queue)
    return q.offsets if q is not None else array("q")


class LeaseChoice:
    """Chooses what a lease takes; reads records through `reader` and holds the window to the
    node's `max_lease_window`."""

    def __init__(self, settings: Settings, reader: RecordReader) -> None:
        self.settings = settings
        self.reader = reader

    async def prepare(self, state: PartitionState, queue: str, consumer: str, work: LeaseWindow,
                      config: ConsumerConfig) -> None:
        """Index the window for leasing (`LeaseWindow.ensure_index`). After replay, first read
        back the ordering keys of the window's records from the records themselves (a
        replayed delivery, or a record skipped for its key, does not carry it)."""
        if work.needs_keys:
            committed = state.committed(queue, consumer) or 0
            unknown = [o for o in work.window(queue_offsets(state, queue), committed)
                       if o not in work.done]
            found = {r.offset: order_key(r)
                     for r in await self.reader.resolve(state.partition, unknown)}
            for off in unknown:
                d = work.deliveries.get(off)
                if d is None:  # skipped for its key before: new, never delivered
                    work.deliveries[off] = Delivery(0, 0, False, found.get(off))
                else:
                    d.order_key = found.get(off)
            work.needs_keys = False
            work.indexed = False
        work.ensure_index(now_ms(), config.max_attempts, config.max_in_flight is not None)

    async def choose(self, state: PartitionState, queue: str, consumer: str, work: LeaseWindow,
                     max_records: int, tag: str | None = None
                     ) -> tuple[list[int], list[int], dict[int, Record]]:
        """The offsets to lease, in offset order: first the window's available records, then
        new ones (each joins the window); a record waits while an earlier record with its
        ordering key is not done. Also the new records `tag` filters out (to complete), and
        the records read on the way (by offset). The chosen records are out of the window's
        index: the caller leases them, or gives them back (`LeaseWindow.give_back`)."""
        chosen = work.take_ready(max_records)
        seen: dict[int, Record] = {}
        if len(chosen) >= max_records:
            return chosen, [], seen
        try:
            skipped = await self._choose_new(state, queue, consumer, work, max_records, tag,
                                             chosen, seen)
        except BaseException:
            work.give_back(chosen, now_ms())
            raise
        return chosen, skipped, seen

    async def _choose_new(self, state: PartitionState, queue: str, consumer: str,
                          work: LeaseWindow, max_records: int, tag: str | None,
                          chosen: list[int], seen: dict[int, Record]) -> list[int]:
        """New records past the frontier join the window; those a lease may take now are
        added to `chosen` (up to `max_records`); returns the ones `tag` filters out."""
        skipped: list[int] = []
        committed = state.committed(queue, consumer) or 0
        room = self.settings.max_lease_window - work.window_size(queue_offsets(state, queue),
                                                                 committed)
        while len(chosen) < max_records and room > 0:
            # Just what is missing: a record looked at and not taken (its key busy) would be
            # read again when it is.
            ahead = state.select(queue, max(work.frontier, committed),
                                 min(room, max_records - len(chosen)), work.frontier_at)
            if not ahead:
                break
            records = {r.offset: r for r in await self.reader.resolve(state.partition, ahead)}
            seen.update(records)
            if state.revoked:
                chosen.clear()
                return []
            now = now_ms()
            for off in ahead:
                if off < work.frontier:  # another call took it meanwhile
                    continue
                rec = records.get(off)
                room -= 1
                if tag is not None and (rec is None or tag not in tags_of(rec.headers)):
                    work.frontier = off + 1
                    skipped.append(off)  # not for this consumer's filter: done as skipped
                elif rec is None:
                    work.frontier = off + 1  # gone (retention): nothing to deliver
                    skipped.append(off)
                else:
                    take = len(chosen) < max_records
                    if work.join(off, order_key(rec) if rec.headers else None, now, take) \
                            and take:
                        chosen.append(off)
                if len(chosen) >= max_records or room <= 0:
                    break
        return skipped
