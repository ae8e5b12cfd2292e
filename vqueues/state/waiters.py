"""Who waits on a partition: readers and leasers parked on a queue until a record comes (long
polls), and writers waiting until their record is indexed (read-your-writes). Woken by the
partition's indexing; all of it on the event loop."""

from __future__ import annotations

import asyncio
from typing import TypeVar

_T = TypeVar("_T")


def _resolve(fut: asyncio.Future[_T], value: _T) -> None:
    """A waiter's timer ran out: resolve `fut` with `value` unless something did first."""
    if not fut.done():
        fut.set_result(value)


class Waiters:
    """Parked readers by queue, and waiters for an offset to be indexed."""

    __slots__ = ("_positions", "readers")

    def __init__(self) -> None:
        # Parked readers per queue; a dict of futures, so one leaving is O(1) (3,000 waiting
        # on one queue each copied the list of the others on timeout). Public: the indexing
        # looks a queue up here on its hot path.
        self.readers: dict[str, dict[asyncio.Future[None], None]] = {}
        self._positions: list[tuple[int, asyncio.Future[bool]]] = []

    async def records(self, queue: str, timeout_s: float) -> None:
        """Return when `queue` is woken, or on timeout."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self.readers.setdefault(queue, {})[fut] = None
        # A timer that resolves the future, not asyncio.wait_for, which makes a coroutine, a
        # second future and a callback per wait: every collection scans what a parked reader
        # holds.
        timer = loop.call_later(timeout_s, _resolve, fut, None)
        try:
            await fut
        finally:
            timer.cancel()
            waiters = self.readers.get(queue)
            if waiters is not None:
                waiters.pop(fut, None)
                if not waiters:
                    del self.readers[queue]

    def parked(self, queue: str) -> int:
        """How many reads of `queue` wait for a record (long polls)."""
        return len(self.readers.get(queue, ()))

    def wake(self, queue: str) -> None:
        for fut in self.readers.pop(queue, ()):
            if not fut.done():
                fut.set_result(None)

    def wake_all(self) -> None:
        for queue in list(self.readers):
            self.wake(queue)

    async def position(self, offset: int, timeout_s: float) -> bool:
        """Wait until `indexed_below` passes `offset` (True), or False on timeout."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._positions.append((offset, fut))
        timer = loop.call_later(timeout_s, _resolve, fut, False)
        try:
            return await fut
        finally:
            timer.cancel()

    def indexed_below(self, next_offset: int) -> None:
        """Every offset below `next_offset` is indexed: release who waited for one."""
        if not self._positions:
            return
        keep = []
        for offset, fut in self._positions:
            if fut.done():
                continue
            if next_offset > offset:
                fut.set_result(True)
            else:
                keep.append((offset, fut))
        self._positions = keep

    def release_all(self) -> None:
        """The partition was given up: every waiter returns (and finds out)."""
        self.wake_all()
        for _, fut in self._positions:
            if not fut.done():
                fut.set_result(True)
        self._positions.clear()
