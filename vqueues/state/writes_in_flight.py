"""A partition's offset-topic writes in flight: a revocation waits for them, so the next owner's
replay sees every write this node acknowledged."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class WritesInFlight:
    """A count of writes begun and not ended, and a way to wait until it is zero."""

    __slots__ = ("_count", "_done")

    def __init__(self) -> None:
        self._count = 0
        self._done: asyncio.Event | None = None

    @contextlib.contextmanager
    def writing(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    def begin(self) -> None:
        self._count += 1

    def end(self) -> None:
        self._count -= 1
        if self._count == 0 and self._done is not None:
            self._done.set()

    async def wait(self, timeout_s: float) -> bool:
        """Wait until no write is in flight; False if one still is after `timeout_s`."""
        if self._count == 0:
            return True
        self._done = asyncio.Event()
        try:
            await asyncio.wait_for(self._done.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
