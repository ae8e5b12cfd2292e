"""Keyed asyncio locks: one lock per key, dropped when nobody holds or waits for it."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterable


class KeyedLocks:
    """`async with locks.hold(key):` serialises work on one key and nothing else."""

    def __init__(self) -> None:
        self._locks: dict[Hashable, tuple[asyncio.Lock, int]] = {}

    def hold(self, key: Hashable) -> _Held:
        return _Held(self, key)

    def __len__(self) -> int:
        """Keys currently held or waited for."""
        return len(self._locks)


class _Held:
    """One `hold`: a plain class, where a generator-based context manager cost a tenth of a
    lease call's own CPU (measured)."""

    __slots__ = ("_key", "_lock", "_locks")

    def __init__(self, locks: KeyedLocks, key: Hashable) -> None:
        self._locks = locks
        self._key = key
        self._lock: asyncio.Lock | None = None

    async def __aenter__(self) -> None:
        table = self._locks._locks
        lock, users = table.get(self._key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        table[self._key] = (lock, users + 1)
        self._lock = lock
        try:
            await lock.acquire()
        except BaseException:
            self._leave()
            raise

    async def __aexit__(self, *exc: object) -> None:
        assert self._lock is not None
        self._lock.release()
        self._leave()

    def _leave(self) -> None:
        table = self._locks._locks
        lock, users = table[self._key]
        if users == 1:
            del table[self._key]
        else:
            table[self._key] = (lock, users - 1)


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
