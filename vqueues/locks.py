"""Keyed asyncio locks: one lock per key, dropped when nobody holds or waits for it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Hashable, Iterable


class KeyedLocks:
    """`async with locks.hold(key):` serialises work on one key and nothing else."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    @contextlib.asynccontextmanager
    async def hold(self, key: Hashable) -> AsyncIterator[None]:
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        """Keys currently held or waited for."""
        return len(self._locks)


class Claims:
    """Keys being written, each by the one call that claimed it. Unlike a lock per key, a call
    claims all its keys at once, without waiting, or learns which write to wait for: 100
    keyed records cost 100 dict entries, not 100 locks (the locks took a fifth of the node's
    CPU under keyed enqueue, measured)."""

    def __init__(self) -> None:
        self._held: dict[Hashable, asyncio.Future[None]] = {}

    def holder(self, key: Hashable) -> asyncio.Future[None] | None:
        """The write that claimed `key` (it resolves when that write ends), if any."""
        return self._held.get(key)

    def claim(self, keys: Iterable[Hashable]) -> asyncio.Future[None]:
        """Claim keys no other call holds (check `holder` first, without awaiting between)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for key in keys:
            self._held[key] = done
        return done

    def release(self, keys: Iterable[Hashable], done: asyncio.Future[None]) -> None:
        for key in keys:
            if self._held.get(key) is done:
                del self._held[key]
        if not done.done():
            done.set_result(None)

    def __len__(self) -> int:
        return len(self._held)
