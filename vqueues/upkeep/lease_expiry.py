"""Lease expiry: a record whose last attempt's lease expires goes to the dead letters when it
expires (within a scheduler tick), not at the next lease call on its consumer
(docs/work-queues.md). Each owned partition keeps the deadlines of its last-attempt leases in
a heap (`LeaseWindows.last_attempts`), so a tick costs what fell due, not a walk of every
lease consumer."""

from __future__ import annotations

import asyncio
import logging

from vqueues.ownership.ownership import Ownership
from vqueues.records import now_ms
from vqueues.state.partition_state import PartitionState
from vqueues.work.work_service import WorkService

log = logging.getLogger(__name__)


# Consumers dead-lettered at once, at most: each holds its consumer's lock and waits for a write
# of the dead letters and one to the offset topic. One consumer after the other, the last of
# 1,000 whose leases expired together waited for 2,000 writes.
DEAD_LETTERINGS_AT_ONCE = 64


class LeaseExpiry:
    def __init__(self, work: WorkService, ownership: Ownership, tick_ms: int) -> None:
        self.work = work
        self.ownership = ownership
        self.tick_s = tick_ms / 1000

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self.tick_s)
            now = now_ms()
            due = [(state, queue, consumer)
                   for state in list(self.ownership.states.values())
                   if state.ready.is_set() and state.lease_windows.last_attempts
                   and state.lease_windows.last_attempts[0][0] <= now
                   for queue, consumer in state.lease_windows.due_last_attempts(now)]
            for start in range(0, len(due), DEAD_LETTERINGS_AT_ONCE):
                await asyncio.gather(*(self._dead_letter(*d)
                                       for d in due[start:start + DEAD_LETTERINGS_AT_ONCE]))

    async def _dead_letter(self, state: PartitionState, queue: str, consumer: str) -> None:
        try:
            await self.work.dead_letter_expired(state, queue, consumer)
        except Exception:  # logged; the next lease call dead-letters them
            log.exception("dead_letter_failed", extra={
                "partition": state.partition, "queue": queue, "consumer": consumer})
