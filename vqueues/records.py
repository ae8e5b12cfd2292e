"""Record formats: the data topic's records and the offset topic's entries.

Data topic: key = the queue name's UTF-8 bytes, value = the payload as given, headers = the
user's headers. Nothing is wrapped, so any Kafka producer can enqueue and any consumer can read.

Offset topic (compacted; partition p holds the state of data partition p). Keys are compact
JSON arrays, so a queue and a consumer name can never be confused whatever they contain:
  ["c", queue, consumer] -> {"v": 1, "offset": n, "ts": ms}       a consumer's committed offset
  ["c", queue, consumer] -> tombstone (null)                         the consumer was deleted
  ["q", queue]           -> {"v": 1, "deleted_before": n, "ts": ms}  the queue was deleted at n:
                                                                      its records below n are gone
See docs/adr/0002-offset-topic-format.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

FORMAT_VERSION = 1

# (key, value) of one offset-topic record; value None is a tombstone.
OffsetRecord = tuple[bytes, bytes | None]


@dataclass(slots=True, frozen=True)
class Record:
    """One record of a queue as read from the data topic."""

    offset: int
    timestamp: int
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(slots=True, frozen=True)
class ConsumerAcked:
    """A consumer's committed offset moved (an ack) at `acked_at_ms` (UTC epoch ms)."""

    queue: str
    consumer: str
    offset: int
    acked_at_ms: int = 0


@dataclass(slots=True, frozen=True)
class ConsumerDeleted:
    queue: str
    consumer: str


@dataclass(slots=True, frozen=True)
class QueueDeleted:
    queue: str
    deleted_before: int


OffsetEntry = ConsumerAcked | ConsumerDeleted | QueueDeleted


def _key(*parts: str) -> bytes:
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def now_ms() -> int:
    return int(time.time() * 1000)


def _value(ts: int = 0, **fields: int) -> bytes:
    body = {"v": FORMAT_VERSION, **fields, "ts": ts or now_ms()}
    return json.dumps(body, separators=(",", ":")).encode()


def encode_offset_entry(entry: OffsetEntry) -> OffsetRecord:
    """The offset-topic record of `entry`."""
    if isinstance(entry, ConsumerAcked):
        return (_key("c", entry.queue, entry.consumer),
                _value(entry.acked_at_ms, offset=entry.offset))
    if isinstance(entry, ConsumerDeleted):
        return _key("c", entry.queue, entry.consumer), None
    return _key("q", entry.queue), _value(deleted_before=entry.deleted_before)


def decode_offset_entry(key: bytes | None, value: bytes | None) -> OffsetEntry | None:
    """Decode one offset-topic record; None for anything not written by vqueues."""
    if not key:
        return None
    try:
        parts = json.loads(key)
        if parts[0] == "c" and len(parts) == 3:
            if value is None:
                return ConsumerDeleted(parts[1], parts[2])
            body = json.loads(value)
            return ConsumerAcked(parts[1], parts[2], int(body["offset"]), int(body.get("ts", 0)))
        if parts[0] == "q" and len(parts) == 2 and value is not None:
            return QueueDeleted(parts[1], int(json.loads(value)["deleted_before"]))
    except (ValueError, KeyError, TypeError, IndexError):
        return None
    return None
