"""The group thread's events, handed to the event loop in order: what the consumer group
reports (assignments, records, ends, failures) is applied on the loop one event per turn, with
backpressure on batches of records and a hold while assigned partitions are being restored."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

# Batches of records applied at most before the group thread waits (backpressure).
MAX_PENDING_BATCHES = 16


class GroupInbox:
    """Events from the group thread (`post`), applied by `run` on the loop. Built on the loop's
    thread: a post from that thread never waits for room."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._loop_thread = threading.get_ident()
        self._inbox: asyncio.Queue[tuple[Callable[[], None], bool]] = asyncio.Queue()
        self._room = threading.BoundedSemaphore(MAX_PENDING_BATCHES)
        # Assignments whose snapshots are being built: events wait for them.
        self._restoring: set[asyncio.Future[None]] = set()

    def post(self, event: Callable[[], None], batch: bool = False) -> None:
        """Hand a group event to the loop, in order. A batch of records waits (blocking the
        group thread) while MAX_PENDING_BATCHES are not applied yet: a replay never piles up
        more than that in memory, and the loop is never handed more than it can take."""
        if batch and threading.get_ident() != self._loop_thread:
            while not self._room.acquire(timeout=1.0):
                if self.loop.is_closed():
                    return
        else:
            batch = False
        self.loop.call_soon_threadsafe(self._inbox.put_nowait, (event, batch))

    async def run(self) -> None:
        """Apply the events one by one, yielding to the loop between them, so requests are
        served while a partition replays."""
        while True:
            event, batch = await self._inbox.get()
            while self._restoring:  # the tail's records come after the snapshot they follow
                await asyncio.wait(self._restoring)
            try:
                event()
            except Exception:
                log.exception("group_event_failed")
            finally:
                if batch:
                    self._room.release()
            await asyncio.sleep(0)

    def hold(self) -> asyncio.Future[None]:
        """Hold the events until the returned future is `released`."""
        held: asyncio.Future[None] = self.loop.create_future()
        self._restoring.add(held)
        return held

    def release(self, held: asyncio.Future[None]) -> None:
        self._restoring.discard(held)
        held.set_result(None)
