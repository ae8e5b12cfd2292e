"""The scheduler: moves each owned partition's scheduled records into their queues when they
fall due (vqueues/schedule.py), every `scheduler_tick_ms`, in due order."""

from __future__ import annotations

import asyncio
import logging
from itertools import groupby

from vqueues.ownership import Ownership
from vqueues.partition_state import PartitionState
from vqueues.records import now_ms
from vqueues.schedule import CANCEL_HEADER, DELIVER_AT_HEADER, FROM_HEADER
from vqueues.service import NewRecord, QueueService

log = logging.getLogger(__name__)


class Scheduler:
    def __init__(self, service: QueueService, ownership: Ownership, tick_ms: int) -> None:
        self.service = service
        self.ownership = ownership
        self.tick_s = tick_ms / 1000

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            for state in list(self.ownership.states.values()):
                if state.ready.is_set() and state.schedule.by_queue:
                    try:
                        await self.move_due(state)
                    except Exception:  # logged; the records are due again at the next tick
                        log.exception("scheduled_move_failed",
                                      extra={"partition": state.partition})

    async def move_due(self, state: PartitionState) -> int:
        """Write every due record of `state` to its queue (as of its due time, in due order);
        returns how many were moved."""
        due = state.schedule.take_due(now_ms())
        if not due:
            return 0
        moved = 0
        try:
            records = {r.offset: r for r in await self.service.resolve(
                state.partition, sorted(i for _, i, _ in due))}
            by_queue = sorted(due, key=lambda e: (e[2], e[0], e[1]))
            for queue, group in groupby(by_queue, key=lambda e: e[2]):
                entries = list(group)
                out: list[NewRecord] = []
                ids = []
                for _, record_id, _ in entries:
                    rec = records.get(record_id)
                    if rec is None:  # retention removed it before its time
                        state.schedule.remove(queue, record_id)
                        log.warning("scheduled_record_gone", extra={
                            "partition": state.partition, "queue": queue, "id": record_id})
                        continue
                    headers = [(k, v) for k, v in rec.headers if v is not None and k not in (
                        DELIVER_AT_HEADER, FROM_HEADER, CANCEL_HEADER)]
                    out.append((rec.value, [*headers, (FROM_HEADER, str(record_id).encode())]))
                    ids.append(record_id)
                if not out or state.revoked:
                    continue
                # Indexing the written records (at their acknowledgement) removes the ids.
                await self.service.append_records(queue, out, state)
                moved += len(out)
                for record_id in ids:
                    state.schedule.remove(queue, record_id)
        finally:
            state.schedule.release(due)  # anything not moved is due again at the next tick
        self.service.metrics.records_scheduled_moved.inc(moved)
        return moved
