"""The scheduler: moves each owned partition's scheduled records into their queues when they
fall due (vqueues/state/schedule.py), in due order: at the earliest due time, and at least every
`scheduler_tick_ms` for records scheduled meanwhile."""

from __future__ import annotations

import asyncio
import functools
import logging
from itertools import groupby
from operator import itemgetter

from vqueues.ownership.ownership import Ownership
from vqueues.queues.service import QueueService
from vqueues.records import NewRecord, now_ms
from vqueues.state.partition_state import PartitionState
from vqueues.state.schedule import CANCEL_HEADER, DELIVER_AT_HEADER, FROM_HEADER

log = logging.getLogger(__name__)

# A partition's moves are at least this far apart: under load each then writes the records of a
# few milliseconds at once, not a write per due millisecond (ADR 15).
MOVE_REST_MS = 5
# Records moved per write (one produce request): a partition's due records are written
# together, queue after queue, in writes of up to this many.
MOVE_BATCH = 1000


class Scheduler:
    """Wakes at the earliest due time of any owned partition (at least once a tick, for records
    scheduled meanwhile) and moves each partition's due records in a task of its own, so one
    partition's write does not hold back another's."""

    def __init__(self, service: QueueService, ownership: Ownership, tick_ms: int) -> None:
        self.service = service
        self.ownership = ownership
        self.tick_s = tick_ms / 1000
        self._moving: dict[int, asyncio.Task[int]] = {}
        self._wake: asyncio.Future[None] | None = None  # the loop's sleep; a move's end wakes it
        self._rest_until: dict[int, int] = {}  # partition -> no move before (epoch ms)

    async def run_forever(self) -> None:
        try:
            while True:
                await self._sleep(self.pause_s())
                now = now_ms()
                for state in list(self.ownership.states.values()):
                    p = state.partition
                    at = self._next_move(state)
                    if at is None or at > now or p in self._moving or \
                            not state.ready.is_set():
                        continue
                    task = asyncio.create_task(self._move(state))
                    self._moving[p] = task
                    task.add_done_callback(functools.partial(self._moved, p))
        finally:  # stopped (the node shuts down): so are the moves, as one awaited move was
            moving = list(self._moving.values())
            for task in moving:
                task.cancel()
            await asyncio.gather(*moving, return_exceptions=True)

    async def _sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`, less if a move ends. (Not `asyncio.wait_for` on an event: on
        Python 3.11 a cancellation arriving as the event is set is lost, and a node's
        shutdown then waited for this loop forever.)"""
        wake = self._wake = asyncio.get_running_loop().create_future()
        timer = asyncio.get_running_loop().call_later(seconds, _wake_up, wake)
        try:
            await wake
        finally:
            timer.cancel()
            self._wake = None

    def _moved(self, partition: int, _: asyncio.Task[int]) -> None:
        self._moving.pop(partition, None)
        self._rest_until[partition] = now_ms() + MOVE_REST_MS
        if self._wake is not None:
            _wake_up(self._wake)

    def _next_move(self, state: PartitionState) -> int | None:
        """When the partition's next move is due: its earliest due time, but not within
        MOVE_REST_MS of its last move."""
        at = state.schedule.next_at()
        if at is None:
            return None
        return max(at, self._rest_until.get(state.partition, 0))

    def pause_s(self) -> float:
        """Until the earliest due time of a ready partition not moving now: at most a tick
        (records scheduled meanwhile, partitions becoming ready), at least a millisecond."""
        soonest = min((at for s in self.ownership.states.values()
                       if s.partition not in self._moving and s.ready.is_set()
                       and (at := self._next_move(s)) is not None), default=None)
        if soonest is None:
            return self.tick_s
        return min(self.tick_s, max(0.001, (soonest - now_ms()) / 1000))

    async def _move(self, state: PartitionState) -> int:
        try:
            return await self.move_due(state)
        except Exception:  # logged; the records are due again at the next wake
            log.exception("scheduled_move_failed", extra={"partition": state.partition})
            return 0

    async def move_due(self, state: PartitionState) -> int:
        """Write every due record of `state` to its queue (as of its due time, in due order);
        returns how many were moved. The partition's queues are moved together, in writes of
        up to MOVE_BATCH records (one produce each), not a write per queue one after the
        other, which makes records due at once in many queues late (ADR 9)."""
        due = state.schedule.take_due(now_ms())
        if not due:
            return 0
        moved = 0
        try:
            records = {r.offset: r for r in await self.service.reader.resolve(
                state.partition, sorted(i for _, i, _ in due))}
            copies: list[tuple[str, NewRecord, int]] = []  # (queue, copy, id), queue by queue
            for _, record_id, queue in sorted(due, key=lambda e: (e[2], e[0], e[1])):
                rec = records.get(record_id)
                if rec is None:  # retention removed it before its time
                    state.schedule.remove(queue, record_id)
                    log.warning("scheduled_record_gone", extra={
                        "partition": state.partition, "queue": queue, "id": record_id})
                    continue
                headers = [(k, v) for k, v in rec.headers if v is not None and k not in (
                    DELIVER_AT_HEADER, FROM_HEADER, CANCEL_HEADER)]
                copies.append((queue, (rec.value, [*headers, (FROM_HEADER,
                                                              str(record_id).encode())]),
                               record_id))
            for start in range(0, len(copies), MOVE_BATCH):
                if state.revoked:
                    break
                batch = copies[start:start + MOVE_BATCH]
                groups = [(queue, [copy for _, copy, _ in run])  # each queue's in turn
                          for queue, run in groupby(batch, key=itemgetter(0))]
                # Indexing the written records (at their acknowledgement) removes the ids.
                await self.service.append_queues(state.partition, state, groups)
                moved += len(batch)
                for queue, _, record_id in batch:
                    state.schedule.remove(queue, record_id)
        finally:
            state.schedule.release(due)  # anything not moved is due again at the next tick
        self.service.metrics.records_scheduled_moved.inc(moved)
        return moved


def _wake_up(wake: asyncio.Future[None]) -> None:
    if not wake.done():
        wake.set_result(None)
