"""Queue-to-partition routing: Kafka's murmur2, exactly as its default partitioner uses it.

A record whose key is the queue name lands, with any Kafka producer's default (murmur2)
partitioner, in `partition_for(queue, n)`; so does everything vqueues writes.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK32 = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 of `data` as an unsigned 32-bit int (Java's `Utils.murmur2`)."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    end = length - (length % 4)
    for i in range(0, end, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> 24
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    rest = length % 4
    if rest == 3:
        h ^= data[end + 2] << 16
    if rest >= 2:
        h ^= data[end + 1] << 8
    if rest >= 1:
        h ^= data[end]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return h


def murmur2_signed(data: bytes) -> int:
    """murmur2 as Java's signed 32-bit int (what Kafka's unit tests print)."""
    h = murmur2(data)
    return h - (1 << 32) if h & 0x80000000 else h


@functools.lru_cache(maxsize=1 << 14)
def partition_for(queue: str, partitions: int) -> int:
    """The data partition that holds `queue`: `(murmur2(utf8(queue)) & 0x7fffffff) % partitions`."""
    return (murmur2(queue.encode("utf-8")) & 0x7FFFFFFF) % partitions


STEP = 16_384  # names encoded per C call: each holds the GIL, which the loop's thread shares


def partitions_for(queues: Sequence[str], partitions: int) -> npt.NDArray[np.int64]:
    """`partition_for` of every queue, in numpy (blocking for many: off the loop). A snapshot
    split routes a million names: one Python murmur2 per name would take seconds."""
    out = np.empty(len(queues), dtype=np.int64)
    for i in range(0, len(queues), STEP):
        encoded = list(map(str.encode, queues[i:i + STEP]))
        sizes = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        h = _murmur2_many(b"".join(encoded), sizes)
        out[i:i + len(encoded)] = (h & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)
    return out


def _murmur2_many(data: bytes, sizes: npt.NDArray[np.int64]) -> npt.NDArray[np.uint32]:
    """`murmur2` of each of the keys laid end to end in `data`, `sizes[i]` bytes each. The
    keys go shortest first, so the ones still hashing a 4-byte block are a suffix."""
    order = np.argsort(sizes, kind="stable")
    starts = (np.cumsum(sizes) - sizes)[order]
    sizes = sizes[order]
    raw = np.frombuffer(data + b"\0\0\0", dtype=np.uint8)
    # Every 4 bytes from each position, little-endian, unaligned: a view, no copy.
    words = np.ndarray((max(len(raw) - 3, 0),), dtype="<u4", buffer=raw, strides=(1,))
    m = np.uint32(_M)
    h = (np.uint32(_SEED) ^ sizes.astype(np.uint32)).astype(np.uint32)
    blocks = sizes // 4
    for i in range(int(blocks[-1]) if len(blocks) else 0):
        lo = int(np.searchsorted(blocks, i, side="right"))  # the keys with a block i
        k = words[starts[lo:] + 4 * i] * m
        k ^= k >> np.uint32(24)
        k *= m
        h[lo:] *= m
        h[lo:] ^= k
    end = starts + 4 * blocks
    rest = sizes % 4
    for tail, shift in ((3, 16), (2, 8), (1, 0)):
        at = rest >= tail
        h[at] ^= raw[end[at] + tail - 1].astype(np.uint32) << np.uint32(shift)
    h[rest >= 1] *= m
    h ^= h >> np.uint32(13)
    h *= m
    h ^= h >> np.uint32(15)
    out = np.empty_like(h)
    out[order] = h
    return out
