"""Record formats: the data topic's records and the offset topic's entries.

Data topic: key = the queue name's UTF-8 bytes, value = the payload as given, headers = the
user's headers. Nothing is wrapped, so any Kafka producer can enqueue and any consumer can read.

Offset topic (compacted; partition p holds the state of data partition p). Keys are compact
JSON arrays, so a queue and a consumer name can never be confused whatever they contain:
  ["c", queue, consumer] -> {"v": 1, "offset": n, "ts": ms}       a consumer's committed offset
  ["c", queue, consumer] -> tombstone (null)                         the consumer was deleted
  ["q", queue]           -> {"v": 1, "deleted_before": n, "ts": ms}  the queue was deleted at n:
                                                                      its records below n are gone
  ["s", queue, consumer] -> {"v": 1, "mode", "max_attempts", "dlq", "visibility_ms"} settings,
                            and "max_in_flight", "prefix", "durable_grants", "attributes" (a
                            str -> str object: an SQS queue's attributes, docs/sqs.md) when
                            set (absent: none, none, false, none)
  ["W", queue, consumer, gen]      -> msgpack `WindowDelta` (checkpoint): a lease consumer's
                                      whole window as ranges, written by generation `gen`
  ["w", queue, consumer, gen, seq] -> msgpack `WindowDelta`: one call's changes to the window
                                      (tombstones: superseded by a later checkpoint)
  ["r", queue, consumer, offset] -> {"v": 1, "a", "u", "l", "d", "k", "why"}  one record's
                                    delivery state (format of ADR 8, still replayed; tombstone:
                                    settled)
  ["g", generation]      -> {"v": 1, "ts": ms}   an owner took the partition over (a fence)
Every entry carries its writer's generation in the `vq-gen` header; replay ignores an entry
whose generation is below the last fence before it (a zombie's late write).
See docs/adr/0002-offset-topic-format.md, 0008-lease-state.md and 0012-lease-state-in-ranges.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

import msgspec

FORMAT_VERSION = 1

# (key, value) of one offset-topic record; value None is a tombstone.
OffsetRecord = tuple[bytes, bytes | None]
# (value, headers) of one record to enqueue.
NewRecord = tuple[bytes | None, list[tuple[str, bytes]]]


class Record(msgspec.Struct, frozen=True, gc=False):
    """One record of a queue as read from the data topic.

    A msgspec Struct rather than a frozen dataclass: one is made per record on every hot path
    (own writes, the tail, cached reads), and a Struct is made many times faster (ADR 15).
    gc=False: a record holds ints, bytes and a tuple of (str, bytes)
    pairs, which can make no cycle, so the collector need not track millions of them."""

    offset: int
    timestamp: int
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


@dataclass(slots=True, frozen=True)
class ConsumerAcked:
    """A consumer's committed offset moved (an ack) at `acked_at_ms` (UTC epoch ms). For a
    lease consumer the offset is its low-water mark, and `dead_lettered` its running count of
    records that went to the dead letters (or failed)."""

    queue: str
    consumer: str
    offset: int
    acked_at_ms: int = 0
    dead_lettered: int = 0


@dataclass(slots=True, frozen=True)
class ConsumerDeleted:
    queue: str
    consumer: str


@dataclass(slots=True, frozen=True)
class QueueDeleted:
    queue: str
    deleted_before: int


@dataclass(slots=True, frozen=True)
class ConsumerConfigured:
    """A consumer's settings (PUT .../consumers/{consumer}, or a first lease; `prefix`: copied
    from the prefix consumer over that prefix, ADR 13)."""

    queue: str
    consumer: str
    mode: str  # "cursor" or "lease"
    max_attempts: int
    dead_letter_queue: str | None
    visibility_ms: int
    max_in_flight: int | None = None
    prefix: str | None = None
    durable_grants: bool = False
    # Attributes kept with the settings (an SQS queue's, ADR 17), sorted by name; () for none.
    attributes: tuple[tuple[str, str], ...] = ()


@dataclass(slots=True, frozen=True)
class ConsumerConfigCleared:
    """A consumer's settings are gone (it was deleted): a tombstone on its settings key."""

    queue: str
    consumer: str


@dataclass(slots=True, frozen=True)
class DeliveryUpdated:
    """One record's state for a lease consumer: leased until `until_ms`, or waiting (a retry,
    not before `until_ms`), or `done` out of order (above the low-water mark)."""

    queue: str
    consumer: str
    offset: int
    attempts: int
    until_ms: int
    leased: bool
    done: bool = False
    order_key: str | None = None
    reason: str | None = None


@dataclass(slots=True, frozen=True)
class DeliveryCleared:
    """A record's delivery state is over (it is below the low-water mark): a tombstone."""

    queue: str
    consumer: str
    offset: int


class DeliveryGroup(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Records of a window set to one state: leased until `until` (or waiting for a retry, not
    before `until`), delivered `attempts` times, the last time in lease call `grant`. In the
    log `offsets` are delta-encoded (ascending)."""

    leased: bool
    until: int
    attempts: int
    grant: int
    reason: str | None
    offsets: list[int]


class WindowDelta(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """One write of a lease consumer's window (ADR 12): the records it sets (`groups`), the
    records it finishes (`done`), the low-water mark and dead-letter count if they moved. A
    checkpoint (`checkpoint`) is the whole window instead: `frontier` and the done ranges
    above the mark (`done_ranges`, flat [start, end) pairs), everything else replaced."""

    queue: str
    consumer: str
    generation: int
    seq: int
    groups: list[DeliveryGroup] = []
    done: list[int] = []
    low_water: int | None = None
    dead_lettered: int | None = None
    ts: int = 0
    checkpoint: bool = False
    frontier: int = 0
    done_ranges: list[int] = []


@dataclass(slots=True, frozen=True)
class WindowKeyCleared:
    """A window write superseded by a later checkpoint: a tombstone on its key (`seq` None:
    the checkpoint key of `generation`)."""

    queue: str
    consumer: str
    generation: int
    seq: int | None


@dataclass(slots=True, frozen=True)
class OwnerFenced:
    """An owner took the partition over with `generation`; older writers are fenced off."""

    generation: int


OffsetEntry = (ConsumerAcked | ConsumerDeleted | QueueDeleted | ConsumerConfigured
               | ConsumerConfigCleared | DeliveryUpdated | DeliveryCleared | OwnerFenced
               | WindowDelta | WindowKeyCleared)
GEN_HEADER = "vq-gen"


def _key(*parts: str | int) -> bytes:
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def now_ms() -> int:
    return int(time.time() * 1000)


def _value(ts: int = 0, **fields: int | str | None) -> bytes:
    body = {"v": FORMAT_VERSION, **fields, "ts": ts or now_ms()}
    return json.dumps(body, separators=(",", ":")).encode()


def _body(fields: Mapping[str, int | str | bool | dict[str, str] | None]) -> bytes:
    body = {"v": FORMAT_VERSION, **fields, "ts": now_ms()}
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def _settings_body(entry: ConsumerConfigured) -> bytes:
    settings: dict[str, int | str | bool | dict[str, str] | None] = {
        "mode": entry.mode, "max_attempts": entry.max_attempts,
        "dlq": entry.dead_letter_queue, "visibility_ms": entry.visibility_ms}
    if entry.max_in_flight is not None:
        settings["max_in_flight"] = entry.max_in_flight
    if entry.prefix is not None:
        settings["prefix"] = entry.prefix
    if entry.durable_grants:
        settings["durable_grants"] = True
    if entry.attributes:
        settings["attributes"] = dict(entry.attributes)
    return _body(settings)


def attributes_of(found: object) -> tuple[tuple[str, str], ...]:
    """A settings entry's (or snapshot row's) attributes as sorted pairs; () for none."""
    if not isinstance(found, dict):
        return ()
    return tuple(sorted((str(k), str(v)) for k, v in found.items()))


def encode_offset_entry(entry: OffsetEntry) -> OffsetRecord:
    """The offset-topic record of `entry`."""
    if isinstance(entry, WindowDelta):  # the entry of every lease call: first
        return window_key(entry.queue, entry.consumer, entry.generation,
                          None if entry.checkpoint else entry.seq), _encode_window(entry)
    if isinstance(entry, ConsumerAcked):
        extra = {"dl": entry.dead_lettered} if entry.dead_lettered else {}
        return (_key("c", entry.queue, entry.consumer),
                _value(entry.acked_at_ms, offset=entry.offset, **extra))
    if isinstance(entry, ConsumerDeleted):
        return _key("c", entry.queue, entry.consumer), None
    if isinstance(entry, QueueDeleted):
        return _key("q", entry.queue), _value(deleted_before=entry.deleted_before)
    if isinstance(entry, ConsumerConfigured):
        return _key("s", entry.queue, entry.consumer), _settings_body(entry)
    if isinstance(entry, ConsumerConfigCleared):
        return _key("s", entry.queue, entry.consumer), None
    if isinstance(entry, DeliveryUpdated):
        fields: dict[str, int | str | None] = {"a": entry.attempts, "u": entry.until_ms,
                                               "l": int(entry.leased)}
        if entry.done:
            fields["d"] = 1
        if entry.order_key is not None:
            fields["k"] = entry.order_key
        if entry.reason is not None:
            fields["why"] = entry.reason
        return _key("r", entry.queue, entry.consumer, entry.offset), _body(fields)
    if isinstance(entry, DeliveryCleared):
        return _key("r", entry.queue, entry.consumer, entry.offset), None
    if isinstance(entry, WindowKeyCleared):
        return window_key(entry.queue, entry.consumer, entry.generation, entry.seq), None
    return _key("g", entry.generation), _value()


def window_key(queue: str, consumer: str, generation: int, seq: int | None) -> bytes:
    """The key of a window write: a checkpoint's (`seq` None) or a delta's."""
    if seq is None:
        return _key("W", queue, consumer, generation)
    prefix = _WINDOW_PREFIXES.get((queue, consumer))
    if prefix is None:  # the JSON of the names, once per consumer (not per write)
        if len(_WINDOW_PREFIXES) >= 10_000:
            _WINDOW_PREFIXES.clear()
        prefix = _WINDOW_PREFIXES[(queue, consumer)] = _key("w", queue, consumer)[:-1]
    return b"%s,%d,%d]" % (prefix, generation, seq)


_WINDOW_PREFIXES: dict[tuple[str, str], bytes] = {}


def _deltas(offsets: list[int]) -> list[int]:
    """Ascending offsets as the first and the gaps after it (small numbers: short msgpack)."""
    if not offsets:
        return offsets
    return [b - a for a, b in zip([0, *offsets], offsets, strict=False)]


def _undeltas(gaps: list[int]) -> list[int]:
    return list(accumulate(gaps))


_WINDOW_ENCODER = msgspec.msgpack.Encoder()
_WINDOW_DECODER = msgspec.msgpack.Decoder(WindowDelta)


def _encode_window(e: WindowDelta) -> bytes:
    # The struct's msgpack form (array_like: an array of its fields in order) written from a
    # tuple, without building a second struct for the delta-encoded offsets.
    return _WINDOW_ENCODER.encode((
        e.queue, e.consumer, e.generation, e.seq,
        [(g.leased, g.until, g.attempts, g.grant, g.reason, _deltas(g.offsets))
         for g in e.groups],
        _deltas(e.done), e.low_water, e.dead_lettered, e.ts or now_ms(), e.checkpoint,
        e.frontier, _deltas(e.done_ranges)))


def _decode_window(value: bytes) -> WindowDelta:
    e = _WINDOW_DECODER.decode(value)
    groups = [DeliveryGroup(g.leased, g.until, g.attempts, g.grant, g.reason,
                            _undeltas(g.offsets)) for g in e.groups]
    return msgspec.structs.replace(e, groups=groups, done=_undeltas(e.done),
                                   done_ranges=_undeltas(e.done_ranges))


def generation_header(generation: int) -> list[tuple[str, bytes]]:
    """The `vq-gen` header every offset-topic write carries (one list per generation: shared,
    never changed)."""
    header = _GEN_HEADERS.get(generation)
    if header is None:
        if len(_GEN_HEADERS) >= 1024:
            _GEN_HEADERS.clear()
        header = _GEN_HEADERS[generation] = [(GEN_HEADER, str(generation).encode())]
    return header


_GEN_HEADERS: dict[int, list[tuple[str, bytes]]] = {}


def outgoing(generation: int, entries: Sequence[OffsetEntry]
             ) -> list[tuple[bytes, bytes | None, list[tuple[str, bytes]]]]:
    """The offset-topic records of `entries`, each with its writer's `vq-gen` header."""
    header = generation_header(generation)
    return [(*encode_offset_entry(e), header) for e in entries]


def generation_of(headers: Sequence[tuple[str, bytes | None]] | None) -> int:
    """The writer's generation from an entry's headers (0: written before fencing existed)."""
    for name, value in headers or ():
        if name == GEN_HEADER and value:
            try:
                return int(value)
            except ValueError:
                return 0
    return 0


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
            return ConsumerAcked(parts[1], parts[2], int(body["offset"]), int(body.get("ts", 0)),
                                 int(body.get("dl", 0)))
        if parts[0] == "q" and len(parts) == 2 and value is not None:
            return QueueDeleted(parts[1], int(json.loads(value)["deleted_before"]))
        if parts[0] == "r" and len(parts) == 4:
            q, c, off = str(parts[1]), str(parts[2]), int(parts[3])
            if value is None:
                return DeliveryCleared(q, c, off)
            b = json.loads(value)
            return DeliveryUpdated(q, c, off, int(b["a"]), int(b["u"]), bool(b["l"]),
                                   bool(b.get("d", 0)), b.get("k"), b.get("why"))
        if parts[0] == "s" and len(parts) == 3:
            if value is None:
                return ConsumerConfigCleared(str(parts[1]), str(parts[2]))
            b = json.loads(value)
            cap = b.get("max_in_flight")
            return ConsumerConfigured(str(parts[1]), str(parts[2]), str(b["mode"]),
                                      int(b["max_attempts"]), b.get("dlq"),
                                      int(b["visibility_ms"]),
                                      int(cap) if cap is not None else None, b.get("prefix"),
                                      bool(b.get("durable_grants", False)),
                                      attributes_of(b.get("attributes")))
        if parts[0] in ("w", "W") and len(parts) in (4, 5):
            q, c, gen = str(parts[1]), str(parts[2]), int(parts[3])
            seq = int(parts[4]) if parts[0] == "w" and len(parts) == 5 else None
            if value is None:
                return WindowKeyCleared(q, c, gen, seq)
            return _decode_window(value)
        if parts[0] == "g" and len(parts) == 2 and value is not None:
            return OwnerFenced(int(parts[1]))
    except (ValueError, KeyError, TypeError, IndexError, msgspec.DecodeError):
        return None
    return None
