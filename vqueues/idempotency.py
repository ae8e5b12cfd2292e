"""Idempotent enqueue: the idempotency keys a partition saw within the window (docs/api.md).

A record may carry an idempotency key in the `vq-idempotency-key` header. Within
`idempotency_window_ms` a second enqueue of the same key to the same queue writes nothing and
answers the first record's offset. The window holds fixed-size fingerprints, not the keys: a
128-bit murmur3 (mmh3) of queue and key, and a 64-bit murmur3 of the payload (value and the
other headers) to tell a true retry from a key reused for something else. The key travels in
the record, so whoever indexes the record (the writer at its acknowledgement, the tail, a new
owner's replay) puts it in the window: dedup survives a change of owner.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import mmh3

from vqueues.records import Record

KEY_HEADER = "vq-idempotency-key"
MAX_KEY_BYTES = 256


class Seen(NamedTuple):
    offset: int
    payload: int  # fingerprint of value + other headers
    at_ms: int  # the record's timestamp


def key_of(headers: Sequence[tuple[str, bytes | None]]) -> bytes | None:
    """The record's idempotency key, if it has one."""
    for name, value in headers:
        if name == KEY_HEADER and value:
            return value
    return None


def fingerprint(queue: str, key: bytes) -> int:
    """128-bit fingerprint of (queue, key): collisions are negligible (2^-64 at 2^32 keys)."""
    return int(mmh3.hash128(queue.encode("utf-8", "surrogatepass") + b"\x00" + key))


def payload_fingerprint(value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
                        ) -> int:
    """64-bit fingerprint of what a record says: its value and headers, the key aside."""
    h = mmh3.hash64(b"\x01" + value if value is not None else b"\x00", signed=False)[0]
    for name, v in sorted((n, v or b"") for n, v in headers if n != KEY_HEADER):
        h = mmh3.hash64(name.encode() + b"\x00" + v, seed=h & 0xFFFFFFFF, signed=False)[0] ^ h
    return h


class IdempotencyWindow:
    """Fingerprints of the keys seen in the last `window_ms`, oldest first."""

    __slots__ = ("_order", "_seen", "window_ms")

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        self._seen: dict[int, Seen] = {}
        self._order: deque[tuple[int, int]] = deque()  # (at_ms, fingerprint), arrival order

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, fp: int, seen: Seen, now_ms: int) -> None:
        """Remember a keyed record (the first one with its key wins)."""
        if not self.window_ms or seen.at_ms < now_ms - self.window_ms or fp in self._seen:
            return
        self._seen[fp] = seen
        self._order.append((seen.at_ms, fp))

    def remember(self, queue: str, rec: Record, now_ms: int) -> None:
        """Remember `rec` of `queue` if it carries a key (replay, the tail, an own write)."""
        key = key_of(rec.headers)
        if key is not None:
            self.add(fingerprint(queue, key),
                     Seen(rec.offset, payload_fingerprint(rec.value, rec.headers),
                          rec.timestamp), now_ms)

    def get(self, fp: int, now_ms: int) -> Seen | None:
        self.expire(now_ms)
        return self._seen.get(fp)

    def expire(self, now_ms: int) -> None:
        cutoff = now_ms - self.window_ms
        order, seen = self._order, self._seen
        while order and order[0][0] < cutoff:
            at, fp = order.popleft()
            entry = seen.get(fp)
            if entry is not None and entry.at_ms == at:
                del seen[fp]

    def drain(self, step: int) -> Iterator[None]:
        """Forget every key, `step` of them between yields (a node lets go of a partition)."""
        order, seen = self._order, self._seen
        while order or seen:
            for _ in range(min(len(order), step)):
                order.popleft()
            for _ in range(min(len(seen), step)):
                seen.popitem()
            yield
