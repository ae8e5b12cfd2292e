"""Idempotent enqueue: the idempotency keys a partition saw within the window (docs/api.md).

A record may carry an idempotency key in the `vq-idempotency-key` header. Within
`idempotency_window_ms` a second enqueue of the same key to the same queue writes nothing and
answers the first record's offset. The window holds fixed-size fingerprints, not the keys: a
128-bit murmur3 (mmh3) of queue and key, and a 64-bit murmur3 of the payload to tell a true
retry from a key reused for something else. The payload is what the user sent: value, headers
and tags, and a schedule as given (`deliver_at` or `delay_ms`), never the due time the node
derives from it; a keyed scheduled record carries that fingerprint in its
`vq-idempotency-payload` header, any other keyed record is compared by its value and headers.
The key travels in the record, so whoever indexes the record (the writer at its
acknowledgement, the tail, a new owner's replay) puts it in the window, and snapshots carry the
window (ADR 9): dedup survives a change of owner.
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

import mmh3
import msgspec

from vqueues.records import Record

KEY_HEADER = "vq-idempotency-key"
PAYLOAD_HEADER = "vq-idempotency-payload"  # a keyed scheduled record's payload, as sent
MAX_KEY_BYTES = 256
CAPTURE_STEP = 20_000  # keys copied into a snapshot per loop pass


class Seen(msgspec.Struct, frozen=True, gc=False):
    """A key the window holds. gc=False: only ints, so the collector need not track the
    window's entries, which under keyed enqueue would set off full collections (ADR 9)."""

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


def fingerprints(queue: str, keys: Iterable[bytes]) -> dict[bytes, int]:
    """`fingerprint` of each key of one queue (the queue's name encoded once)."""
    prefix = queue.encode("utf-8", "surrogatepass") + b"\x00"
    hash128 = mmh3.hash128
    return {k: int(hash128(prefix + k)) for k in keys}


def payload_fingerprint(value: bytes | None, headers: Sequence[tuple[str, bytes | None]]
                        ) -> int:
    """64-bit fingerprint of what a record says: its value and headers, the key aside."""
    h = mmh3.hash64(b"\x01" + value if value is not None else b"\x00", signed=False)[0]
    if len(headers) == 1 and headers[0][0] == KEY_HEADER:  # the usual keyed record
        return h
    for name, v in sorted((n, v or b"") for n, v in headers
                          if n != KEY_HEADER and n != PAYLOAD_HEADER):
        h = mmh3.hash64(name.encode() + b"\x00" + v, seed=h & 0xFFFFFFFF, signed=False)[0] ^ h
    return h


def sent_fingerprint(value: bytes | None, headers: Sequence[tuple[str, bytes | None]],
                     schedule: tuple[str, int] | None) -> int:
    """The payload fingerprint of what a user sent: value and headers (tags included), and the
    schedule as given (("deliver_at", due) or ("delay_ms", delay)), not the due time derived
    from it."""
    h = payload_fingerprint(value, headers)
    if schedule is None:
        return h
    name, number = schedule
    return mmh3.hash64(f"\x02{name}={number}".encode(), seed=h & 0xFFFFFFFF,
                       signed=False)[0] ^ h


def payload_header(fingerprint: int) -> tuple[str, bytes]:
    """The `vq-idempotency-payload` header carrying a sent payload's fingerprint."""
    return PAYLOAD_HEADER, b"%016x" % fingerprint


def payload_of(value: bytes | None, headers: Sequence[tuple[str, bytes | None]]) -> int:
    """A keyed record's payload fingerprint: the one its `vq-idempotency-payload` header
    carries, else its value and headers' (a record a Kafka producer wrote)."""
    for name, v in headers:
        if name == PAYLOAD_HEADER and v:
            try:
                return int(v, 16)
            except ValueError:
                break
    return payload_fingerprint(value, headers)


class KeySection(NamedTuple):
    """The window's part of a snapshot, as columns in arrival order: 128-bit fingerprints
    (16 bytes each, little-endian), record offsets, payload fingerprints, record timestamps."""

    fingerprints: bytes
    offsets: bytes  # int64
    payloads: bytes  # uint64
    at_ms: bytes  # int64

    @classmethod
    def empty(cls) -> KeySection:
        return cls(b"", b"", b"", b"")

    @property
    def keys(self) -> int:
        return len(self.fingerprints) // 16


class IdempotencyWindow:
    """Fingerprints of the keys seen in the last `window_ms`, oldest first."""

    __slots__ = ("_order", "_seen", "known", "window_ms")

    def __init__(self, window_ms: int) -> None:
        self.window_ms = window_ms
        # offset -> (fingerprint, payload) of own keyed writes being indexed: the writer
        # computed both already, and they are dear to compute twice (ADR 15).
        self.known: dict[int, tuple[int, int]] = {}
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
        known = self.known.get(rec.offset) if self.known else None
        if known is not None:  # an own keyed write: its writer has the fingerprints
            self.add(known[0], Seen(rec.offset, known[1], rec.timestamp), now_ms)
            return
        key = key_of(rec.headers)
        if key is not None:
            self.add(fingerprint(queue, key),
                     Seen(rec.offset, payload_of(rec.value, rec.headers), rec.timestamp),
                     now_ms)

    def get(self, fp: int, now_ms: int) -> Seen | None:
        self.expire(now_ms)
        return self._seen.get(fp)

    def lookup(self, fp: int) -> Seen | None:
        """`get` without expiring first (the caller did, for a batch of keys)."""
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

    # The snapshot's section ----------------------------------------------------------------

    def capture(self, cut: int) -> Iterator[KeySection | None]:
        """The keys of records below `cut`, in arrival order: the order is copied now (the
        cut; one C-level copy), then read CAPTURE_STEP keys per step (the caller yields the
        loop between steps, None); the last step yields the section."""
        return self._capture(list(self._order), cut)

    def _capture(self, order: list[tuple[int, int]], cut: int
                 ) -> Iterator[KeySection | None]:
        seen = self._seen
        fps = bytearray()
        offsets, payloads, at_ms = array("q"), array("Q"), array("q")
        for i in range(0, len(order), CAPTURE_STEP):
            for at, fp in order[i:i + CAPTURE_STEP]:
                entry = seen.get(fp)
                if entry is not None and entry.at_ms == at and entry.offset < cut:
                    fps += fp.to_bytes(16, "little")
                    offsets.append(entry.offset)
                    payloads.append(entry.payload)
                    at_ms.append(at)
            yield None
        yield KeySection(bytes(fps), offsets.tobytes(), payloads.tobytes(), at_ms.tobytes())

    @classmethod
    def restore(cls, window_ms: int, section: KeySection, now_ms: int) -> IdempotencyWindow:
        """A window holding the keys `capture` described that are still inside it (blocking
        for many keys: off the loop)."""
        window = cls(window_ms)
        offsets, payloads, at_ms = array("q"), array("Q"), array("q")
        offsets.frombytes(section.offsets)
        payloads.frombytes(section.payloads)
        at_ms.frombytes(section.at_ms)
        if not len(offsets) == len(payloads) == len(at_ms) == section.keys:
            raise ValueError("the key section's columns do not agree")
        raw = section.fingerprints
        for i in range(len(offsets)):
            window.add(int.from_bytes(raw[16 * i:16 * i + 16], "little"),
                       Seen(offsets[i], payloads[i], at_ms[i]), now_ms)
        return window
