"""Queue-to-partition routing: Kafka's murmur2, exactly as its default partitioner uses it.

A record whose key is the queue name lands, with any Kafka producer's default (murmur2)
partitioner, in `partition_for(queue, n)`; so does everything vqueues writes.
"""

from __future__ import annotations

import functools

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
