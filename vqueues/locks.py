"""Keyed asyncio locks: one lock per key, dropped when nobody holds or waits for it."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable, Iterable


class KeyedLocks:
    """`async with locks.hold(key):` serialises work on one key and nothing else.

    A key's entry is the queue of the holds waiting for it: a hold nobody contends makes no
    lock and no future (an asyncio.Lock per hold is a large part of a lease call's CPU), and
    a release hands the key to the first waiter in order."""

    def __init__(self) -> None:
        self._held: dict[Hashable, deque[asyncio.Future[None]]] = {}

    def hold(self, key: Hashable) -> _Held:
        return _Held(self, key)

    def held(self, key: Hashable) -> bool:
        return key in self._held

    async def acquire(self, key: Hashable) -> None:
        """Take `key`, waiting for it (then `release` it)."""
        await _Held(self, key).__aenter__()

    def try_hold(self, key: Hashable) -> bool:
        """Take `key` now if nobody holds it (then `release` it); never waits."""
        if key in self._held:
            return False
        self._held[key] = deque()
        return True

    def release(self, key: Hashable) -> None:
        """Give up a key taken with `acquire` or `try_hold` (to its first waiter, if any)."""
        self._release(key)

    def __len__(self) -> int:
        """Keys currently held or waited for."""
        return len(self._held)

    def _release(self, key: Hashable) -> None:
        waiters = self._held[key]
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the key passes to this waiter
                return
        del self._held[key]


class _Held:
    """One `hold`: a plain class, cheaper per call than a generator-based context manager."""

    __slots__ = ("_key", "_locks")

    def __init__(self, locks: KeyedLocks, key: Hashable) -> None:
        self._locks = locks
        self._key = key

    async def __aenter__(self) -> None:
        table = self._locks._held
        waiters = table.get(self._key)
        if waiters is None:
            table[self._key] = deque()
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self._locks._release(self._key)  # handed the key, cancelled before running
            else:
                waiters.remove(fut)
            raise

    async def __aexit__(self, *exc: object) -> None:
        self._locks._release(self._key)


class Claims:
    """Keys being written, each by the one call that claimed it. Unlike a lock per key, a call
    claims all its keys at once, without waiting, or learns which write to wait for: 100
    keyed records cost 100 dict entries, not 100 locks."""

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
