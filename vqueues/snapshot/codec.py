"""Index snapshots: a partition's state written to the compacted snapshot topic, so that a node
taking the partition over loads it and replays only what came after (ADR 7).

A snapshot holds, as of a **cut** (data position P, offset-topic position O), every queue's
retained offsets, deletion floor and consumers, the consumers' settings, the lease consumers'
windows (ADR 8) and the partition's fence. It is captured in chunks across loop turns;
changes made meanwhile may leak into later chunks, which is harmless: records are only ever
appended at or above P (the capture keeps offsets below P), retention only trims what a loader
trims too, and every offset-topic entry is last-writer-wins, so replaying the entries from O on
top of the snapshot yields the state a full replay builds (tested with random histories).

On the wire (snapshot topic partition p holds data partition p's snapshots):
  ["c", p, id, i] -> "VQS2" + part i of the zlib body (columns, offsets delta-encoded)
                                                                    chunks, each < 1 MB
  ["m", p]        -> JSON manifest {"v", "id", "chunks", "sha256", "data_position",
                                    "offsets_position", "log_start", "queues", "records", "ts"}
The manifest is written after every chunk was acknowledged: a reader never loads half a
snapshot, and one whose chunks are missing or do not match the manifest's digest is ignored
with a warning (the partition is then replayed in full).
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import json
import logging
import operator
import zlib
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain, compress, islice
from typing import Any

import msgspec
import numpy as np
from sortedcontainers import SortedList

from vqueues import memory
from vqueues.records import now_ms
from vqueues.state.idempotency import IdempotencyWindow, KeySection
from vqueues.state.lease_windows import ConfigRow, WorkRow
from vqueues.state.partition_index import PartitionIndex
from vqueues.state.partition_state import PartitionState
from vqueues.state.queue_index import NO_CONSUMERS, QueueIndex, StatefulQueueIndex
from vqueues.state.queue_map import QUEUE_SHARDS, QueueMap
from vqueues.state.tag_index import TagIndex

log = logging.getLogger(__name__)

FORMAT_VERSION = 7
# Format 2 has no lease state; formats 2 and 3 hold the offsets raw, formats 4 to 7
# delta-encoded; format 5 adds the idempotency window (before it, a restored window starts
# empty); format 6 adds each delivery's grant and each window's keys in the offset topic
# (ADR 12; a window of an older format is taken for ADR 8's, and checkpointed at its first
# write); format 7 adds each consumer's in-flight cap and the prefix its settings came from
# (ADR 13; an older row has neither).
READABLE_VERSIONS = (2, 3, 4, 5, 6, 7)
# The narrowest of these that holds every gap: (type, largest value).
_GAP_TYPES: tuple[tuple[str, int], ...] = (
    ("<u1", 2**8 - 1), ("<u2", 2**16 - 1), ("<u4", 2**32 - 1), ("<i8", 2**63 - 1))
MAGIC = b"VQS2"
CHUNK_BYTES = 900_000  # below Kafka's default 1 MB message limit
# Queues copied per loop turn: 5000 took 30-40 ms a turn with a million queues, which showed
# in the p99 of requests served meanwhile (listing p99 39 ms during a capture, measured).
CAPTURE_CHUNK = 1000
# Offsets copied per loop turn (2 MB): a turn that copied every offset of 1000 queues holding
# 16M records stalled the loop for 278 ms under enqueue load (measured); a long queue is copied
# a slice per turn.
CAPTURE_OFFSETS = 262_144


class SnapshotError(Exception):
    """A snapshot that cannot be used (incomplete, corrupt, another format)."""


@dataclass(slots=True)
class Snapshot:
    """A partition's index, column by column: queue i is `names[i]`, with `counts[i]` offsets
    (the next ones in `offsets`), deletion floor `deleted[i]`; consumers are
    (queue index, consumer, committed offset, last ack at)."""

    partition: int
    data_position: int  # P: every record below it is in the snapshot
    offsets_position: int  # O: every offset-topic entry below it is in the snapshot
    log_start: int
    names: list[str] = field(default_factory=list)
    counts: array[int] = field(default_factory=lambda: array("q"))
    deleted: array[int] = field(default_factory=lambda: array("q"))
    offsets: array[int] = field(default_factory=lambda: array("q"))
    consumers: list[tuple[int, str, int, int]] = field(default_factory=list)
    fence: int = 0
    configs: list[ConfigRow] = field(default_factory=list)  # `LeaseWindows.capture`'s
    work: list[WorkRow] = field(default_factory=list)
    # (queue, tag, offsets as raw int64): the tag index below the cut
    tags: list[tuple[str, str, bytes]] = field(default_factory=list)
    # (queue, id, due): records waiting for their due time, below the cut
    scheduled: list[tuple[str, int, int]] = field(default_factory=list)
    # The idempotency window's keys of records below the cut (format 5)
    keys: KeySection = field(default_factory=KeySection.empty)
    # A loaded snapshot keeps its offsets encoded (`encode_offsets`), and `offsets` empty, until
    # `build` decodes them straight into the queues.
    column: bytes | memoryview | None = None
    # A captured snapshot's offsets, in the slices the capture copied them in (after `offsets`),
    # joined off the loop by `decoded_offsets`: one array grown to millions of offsets on the
    # loop stalled it for 108 ms whenever it was reallocated (9,000 fresh pages, measured).
    pieces: list[array[int]] = field(default_factory=list)

    @property
    def records(self) -> int:
        if self.column is not None or self.pieces:
            return sum(self.counts)
        return len(self.offsets)

    def decoded_offsets(self) -> array[int]:
        """Every queue's offsets, in queue order (decoded if the snapshot was loaded, joined
        if it was captured; blocking for millions of them: off the loop)."""
        parts = self.offset_parts()
        if len(parts) == 1:
            return parts[0]
        out = array("q", [0]) * sum(map(len, parts))
        flat = np.frombuffer(out, dtype=np.int64)
        at = 0
        for part in parts:
            flat[at:at + len(part)] = np.frombuffer(part, dtype=np.int64)
            at += len(part)
        return out

    def offset_parts(self) -> list[array[int]]:
        """Every queue's offsets, in queue order, in parts (blocking if the snapshot was
        loaded: off the loop)."""
        if self.column is not None:
            return [decode_offsets(self.column, self.counts)]
        return [self.offsets, *self.pieces]


async def capture(state: PartitionState, offsets_position: int) -> Snapshot:
    """Copy `state` as of now (the cut), a chunk of queues per loop turn. The caller makes sure
    no offset-topic write is in flight at the cut, so `offsets_position` matches the state.
    Listed queues come in name order (from the state's sorted names), so a loader builds its
    sorted list without sorting."""
    image = Snapshot(state.partition, state.next_offset, offsets_position, state.log_start,
                     fence=state.fence)
    # Each part's own section. Consumer settings and lease windows are small (bounded per
    # consumer): copied at the cut; the schedule and the tags keep what lies below it.
    image.configs, image.work = state.leases.capture()
    cut = image.data_position
    image.scheduled = state.schedule.capture(cut)
    image.tags = state.tags.capture(cut)
    keys = state.idempotency.capture(cut)  # the window's order is copied here, at the cut
    # The queues listed at the cut, in name order (a loader then builds its sorted list without
    # sorting), then every other queue the index holds (deletion markers, and whatever the
    # history running meanwhile added), each copied once. Both are walked a chunk per loop
    # turn, never copied whole: touching a million names in one turn stalled the loop for
    # 100 ms (measured). Names listed after the cut, behind the walk, are missed: a queue
    # listed after the cut holds nothing below P and its entries are at or after O, which the
    # loader replays. `copied` is split like the queue map, so no one set grows huge.
    copied: list[set[str]] = [set() for _ in range(QUEUE_SHARDS)]
    image.pieces.append(array("q"))
    turn = _Turn(state)
    after: str | None = None
    while True:
        names = (state.names if after is None
                 else state.names.irange(after, None, inclusive=(False, True)))
        chunk = list(islice(names, CAPTURE_CHUNK))
        if not chunk:
            break
        await _copy(state, image, chunk, turn)
        for name in chunk:
            copied[QueueMap.shard_of(name)].add(name)
        after = chunk[-1]
        await turn.next()
    for shard in range(QUEUE_SHARDS):
        done = copied[shard]
        rest = [n for n in state.queues.shard_names(shard) if n not in done]
        for i in range(0, len(rest), CAPTURE_CHUNK):
            await _copy(state, image, rest[i:i + CAPTURE_CHUNK], turn)
            await turn.next()
        await turn.next()
    for section in keys:
        if section is not None:
            image.keys = section
        await turn.next()
    return image


class _Turn:
    """A capture's share of one loop turn: it yields the loop between chunks of queues, and
    within a chunk once it copied CAPTURE_OFFSETS offsets."""

    __slots__ = ("offsets", "state")

    def __init__(self, state: PartitionState) -> None:
        self.state = state
        self.offsets = 0

    async def next(self) -> None:
        """End this turn: let the loop serve others, then go on unless the partition is gone."""
        self.offsets = 0
        await asyncio.sleep(0)
        if self.state.revoked:
            raise SnapshotError("partition revoked during the capture")


async def _copy(state: PartitionState, image: Snapshot, names: list[str], turn: _Turn) -> None:
    cut = image.data_position
    pieces = image.pieces  # each at most CAPTURE_OFFSETS long: a queue's offsets, or several
    consumers = image.consumers
    for name in names:
        q = state.queues.get(name)
        if q is None:
            continue
        if q.consumers:
            index = len(image.names)
            consumers.extend((index, c, off, at) for c, (off, at) in q.consumers.items())
        image.names.append(name)
        image.deleted.append(q.deleted_before)
        offsets = q.offsets
        n = len(offsets)
        if not n or (offsets[-1] < cut and n <= CAPTURE_OFFSETS - len(pieces[-1])):
            # The common case, a short queue below the cut: whole, into the current piece.
            if n:
                pieces[-1].extend(offsets)
            image.counts.append(n)
        else:
            image.counts.append(await _copy_long(q, cut, pieces, turn))
        turn.offsets += n
        if turn.offsets >= CAPTURE_OFFSETS:
            await turn.next()


async def _copy_long(q: QueueIndex, cut: int, pieces: list[array[int]], turn: _Turn) -> int:
    """Copy q's offsets below `cut` a slice per turn; how many it copied. Between turns q may
    get records (at or after the cut: not copied), be trimmed at the front, or be replaced in
    the map by a stateful copy (`QueueMap.stateful`): the slices go by offset value, not by
    position, and keep to the object they started with, which holds the same offsets."""
    count = 0
    start = 0  # the lowest offset not copied yet
    while True:
        offsets = q.offsets
        lo = bisect_left(offsets, start) if start else 0
        hi = bisect_left(offsets, cut, lo)
        end = min(hi, lo + CAPTURE_OFFSETS)
        if end > lo:
            if len(pieces[-1]) + end - lo <= CAPTURE_OFFSETS:
                pieces[-1].extend(offsets[lo:end])
            else:
                pieces.append(offsets[lo:end])
            count += end - lo
            start = offsets[end - 1] + 1
        if end >= hi:
            return count
        await turn.next()


def _key(*parts: str | int) -> bytes:
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode()


def manifest_key(partition: int) -> bytes:
    return _key("m", partition)


def chunk_key(partition: int, snapshot_id: int, index: int) -> bytes:
    return _key("c", partition, snapshot_id, index)


def encode(snapshot: Snapshot, snapshot_id: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The chunk records and the manifest value of `snapshot` (blocking: run it off the loop).
    Body: an 8-byte length, the msgpack of the small columns, then the offsets delta-encoded
    (`encode_offsets`), all zlib-compressed."""
    # Names as one UTF-8 text and their lengths: decoded in small steps that let the loop's
    # thread run, where a msgpack list of a million strings held the GIL for its whole decode.
    # Written in steps too (the msgpack framed by hand around them): at a million queues the
    # lengths, the text and the msgpack's one copy of them held it for 20-40 ms each.
    names, lengths, text = snapshot.names, array("q"), []
    for i in range(0, len(names), NAMES_STEP):
        step = names[i:i + NAMES_STEP]
        lengths.extend(map(len, step))
        text.append("".join(step).encode("utf-8", "surrogatepass"))
    meta = [b"\x96", _bin(sum(map(len, text))), *text]  # an array of 6: the loader's msgpack
    for column in (lengths, snapshot.counts, snapshot.deleted):
        meta += [_bin(len(column) * column.itemsize), column.tobytes()]
    meta += [msgspec.msgpack.encode(snapshot.consumers),
             msgspec.msgpack.encode([snapshot.fence, snapshot.configs, snapshot.work,
                                     snapshot.tags, snapshot.scheduled, list(snapshot.keys)])]
    body = _deflate(chain(
        (sum(map(len, meta)).to_bytes(8, "little"), *meta),
        encode_offset_parts(snapshot.offset_parts(), snapshot.counts)))
    parts = [body[i:i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)] or [b""]
    chunks = [(chunk_key(snapshot.partition, snapshot_id, i), MAGIC + part)
              for i, part in enumerate(parts)]
    manifest = json.dumps({
        "v": FORMAT_VERSION, "id": snapshot_id, "chunks": len(parts),
        "sha256": hashlib.sha256(body).hexdigest(), "data_position": snapshot.data_position,
        "offsets_position": snapshot.offsets_position, "log_start": snapshot.log_start,
        "queues": len(snapshot.names), "records": snapshot.records,
        "keys": snapshot.keys.keys, "ts": now_ms(),
    }, separators=(",", ":")).encode()
    return chunks, manifest


def _bin(size: int) -> bytes:
    """The header of a msgpack bin 32 of `size` bytes."""
    return b"\xc6" + size.to_bytes(4, "big")


LONG_QUEUE = 4096  # offsets from which `build` decodes a queue straight into its own array

# Compression, decompression and text decoding go in steps of this many bytes: each call holds
# the GIL, and one call over a million queues' 78 MB held it (and so stalled the loop's thread)
# for 50-130 ms (measured).
STEP_BYTES = 4 << 20
NAMES_STEP = 16_384  # queue names cut per C call
SUM_WINDOW = 1 << 20  # gaps summed per `reduceat` call (it widens them all first)


def _deflate(pieces: Iterable[bytes]) -> bytes:
    z = zlib.compressobj(1)
    out: list[bytes] = []
    for piece in pieces:
        view = memoryview(piece)
        out.extend(z.compress(view[i:i + STEP_BYTES]) for i in range(0, len(view), STEP_BYTES))
    out.append(z.flush())
    return b"".join(out)


def _inflate(body: bytes) -> bytes:
    z = zlib.decompressobj()
    out: list[bytes] = []
    rest: bytes = body
    while rest:
        out.append(z.decompress(rest, STEP_BYTES))
        rest = z.unconsumed_tail
    out.append(z.flush())
    if not z.eof:
        raise SnapshotError("the snapshot's body is truncated")
    return b"".join(out)


def _names(raw: bytes | memoryview, lengths: array[int]) -> list[str]:
    """The queue names: their UTF-8 text decoded a step at a time and cut at their lengths
    (by `map`, in C, a step's names at a time: a Python loop over a million names took a
    third of a takeover's loading)."""
    decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
    view = memoryview(raw)
    ends = np.cumsum(np.frombuffer(lengths, dtype=np.int64))
    out: list[str] = []
    text, base, first = "", 0, 0  # `text` starts where name `first` does, at character `base`
    for i in range(0, len(view) + 1, STEP_BYTES):
        final = i + STEP_BYTES >= len(view)
        try:
            text += decoder.decode(view[i:i + STEP_BYTES], final)
        except UnicodeDecodeError as exc:
            raise SnapshotError(f"queue names are not UTF-8: {exc}") from None
        last = int(np.searchsorted(ends, base + len(text), side="right"))  # names complete
        if last > first:
            stops = (ends[first:last] - base).tolist()
            starts = [0, *stops[:-1]]
            for j in range(0, len(stops), NAMES_STEP):
                # A step of short names holds hundreds of thousands: cut NAMES_STEP per C call
                # (600,000 in one held the GIL, and so stalled the loop, for 70 ms).
                out.extend(map(text.__getitem__, map(slice, starts[j:j + NAMES_STEP],
                                                     stops[j:j + NAMES_STEP])))
            text, base, first = text[stops[-1]:], base + stops[-1], last
        if final:
            break
    if first != len(ends) or text:
        raise SnapshotError("queue names do not match their lengths")
    return out


def _starts(counts: array[int]) -> Any:
    """Where each queue with offsets begins in the flat offsets column."""
    sizes = np.frombuffer(counts, dtype=np.int64)
    ends = np.cumsum(sizes)
    return (ends - sizes)[sizes > 0]


def encode_offsets(offsets: array[int], counts: array[int]) -> bytes:
    """The flat offsets column, delta-encoded so that takeover time does not grow with the
    records (issue 8: 8M offsets decode in tens of ms, where raw int64 took 0.3 s to
    decompress, plus 12 MB to fetch). One type byte, each non-empty queue's jump from the
    previous queue's last offset (int64), then the gaps between a queue's consecutive offsets
    in the narrowest unsigned type that holds them all: one byte per record when a queue's
    records lie close together, and runs of equal gaps compress to almost nothing."""
    return b"".join(encode_offset_parts([offsets], counts))


def encode_offset_parts(parts: Sequence[array[int]], counts: array[int]) -> Iterator[bytes]:
    """`encode_offsets` of the parts' offsets joined, a part at a time: never a copy of the
    whole column. Joined first, the snapshot of 14.6M offsets (five minutes of enqueue load)
    took live memory from 220 to 736 MB, and calls that held the GIL over fresh pages stalled
    the loop's thread for 270 ms (measured); a part is at most CAPTURE_OFFSETS long."""
    starts = _starts(counts)
    jumps: list[Any] = []
    largest = 0
    for deltas, at_start in _part_deltas(parts, starts):
        jumps.append(deltas[at_start])
        gaps = np.delete(deltas, at_start)
        if len(gaps):
            largest = max(largest, int(gaps.max()))
    kind = next(i for i, (_, most) in enumerate(_GAP_TYPES) if largest <= most)
    yield bytes([kind])
    if jumps:
        yield np.concatenate(jumps).astype("<i8").tobytes()
    gap_type = _GAP_TYPES[kind][0]
    for deltas, at_start in _part_deltas(parts, starts):
        yield np.delete(deltas, at_start).astype(gap_type).tobytes()


def _part_deltas(parts: Sequence[array[int]], starts: Any) -> Iterator[tuple[Any, Any]]:
    """Each part's offsets minus the offset before them (0 before the first), and where in
    the part a non-empty queue starts."""
    before, at = np.int64(0), 0
    for part in parts:
        flat = np.frombuffer(part, dtype=np.int64)
        if not len(flat):
            continue
        lo, hi = np.searchsorted(starts, (at, at + len(flat)))
        deltas = np.empty_like(flat)
        deltas[0] = flat[0] - before
        np.subtract(flat[1:], flat[:-1], out=deltas[1:])
        yield deltas, starts[lo:hi] - at
        before, at = flat[-1], at + len(flat)


def _column(raw: bytes | memoryview, counts: array[int]) -> tuple[Any, Any, Any]:
    """The parts of an encoded offsets column, checked against the counts: where each
    non-empty queue starts in the flat column, the queues' jumps, and the gaps."""
    starts = _starts(counts)
    total = sum(counts)
    if not raw:
        raise SnapshotError("the offsets column is empty")
    kind = raw[0]
    if kind >= len(_GAP_TYPES):
        raise SnapshotError(f"unknown offset gap type {kind}")
    gap_type = np.dtype(_GAP_TYPES[kind][0])
    jumps_end = 1 + 8 * len(starts)
    if len(raw) != jumps_end + gap_type.itemsize * (total - len(starts)):
        raise SnapshotError("the offsets column does not match the counts")
    return (starts, np.frombuffer(raw, dtype="<i8", count=len(starts), offset=1),
            np.frombuffer(raw, dtype=gap_type, offset=jumps_end))


def _prefix_sum(starts: Any, jumps: Any, gaps: Any) -> array[int]:
    # Computed in place in the array returned: each extra copy of 8M offsets costs ~40 ms
    # here, most of it the kernel handing out fresh pages.
    total = len(jumps) + len(gaps)
    out = array("q", [0]) * total
    flat = np.frombuffer(out, dtype=np.int64)
    at_start = np.zeros(total, dtype=bool)
    at_start[starts] = True
    flat[at_start] = jumps
    flat[~at_start] = gaps
    np.cumsum(flat, out=flat)
    return out


def decode_offsets(raw: bytes | memoryview, counts: array[int]) -> array[int]:
    """The flat offsets column `encode_offsets` wrote (a prefix sum in numpy)."""
    return _prefix_sum(*_column(raw, counts))


def _run_sums(gaps: Any, starts: Any, counts: Any) -> Any:
    """Each run of `gaps` (from starts[i], counts[i] long) summed, as int64. `reduceat` first
    copies its whole input into int64 (8M one-byte gaps: 64 MB of fresh pages, a third of a
    takeover's build), so it runs over windows of SUM_WINDOW gaps, and a run longer than that
    is summed alone (`sum` widens in small buffers)."""
    out = np.zeros(len(starts), dtype=np.int64)
    runs = np.flatnonzero(counts > 0)  # reduceat wants increasing indices inside the array
    run_starts = starts[runs]
    i = 0
    while i < len(runs):
        lo = int(run_starts[i])
        j = max(int(np.searchsorted(run_starts, lo + SUM_WINDOW)), i + 1)
        if j > i + 1 and counts[runs[j - 1]] > SUM_WINDOW:
            j -= 1  # a long run after short ones: alone, next
        hi = int(run_starts[j - 1] + counts[runs[j - 1]])
        if j == i + 1:
            out[runs[i]] = gaps[lo:hi].sum(dtype=np.int64)
        else:
            out[runs[i:j]] = np.add.reduceat(gaps[lo:hi], run_starts[i:j] - lo, dtype=np.int64)
        i = j
    return out


def decode_queues(raw: bytes | memoryview, counts: array[int], long_from: int
                  ) -> tuple[array[int], dict[int, QueueIndex]]:
    """The offsets column decoded for building the index: each queue of at least `long_from`
    offsets straight into its own QueueIndex (queue number -> index), the others' offsets in
    one flat array, in queue order. A long queue's offsets are so written once, not twice
    (into the flat column, then into its array): 8M offsets over 10 queues load in half the
    time, which is most of what a takeover's time still grows by with the records."""
    starts, jumps, gaps = _column(raw, counts)
    sizes = np.frombuffer(counts, dtype=np.int64)
    present = sizes > 0
    lengths = sizes[present]  # of the non-empty queues, as `jumps`
    is_long = lengths >= long_from
    if not is_long.any():
        return _prefix_sum(starts, jumps, gaps), {}
    gap_counts = lengths - 1
    gap_starts = np.cumsum(gap_counts) - gap_counts
    sums = _run_sums(gaps, gap_starts, gap_counts)  # each queue's last offset minus its first
    firsts = np.cumsum(jumps + np.concatenate((np.zeros(1, np.int64), sums[:-1])))
    number = np.flatnonzero(present)  # the queue number of each non-empty queue
    long: dict[int, QueueIndex] = {}
    scratch = np.empty(int(lengths[is_long].max()), dtype=np.int64)
    new: Any = array.__new__
    for k in np.flatnonzero(is_long).tolist():
        n, g0, first = int(lengths[k]), int(gap_starts[k]), int(firsts[k])
        # Widened by assignment, then summed in place: cumsum(dtype=) would first copy the
        # gaps into a fresh int64 array of their own (measured: a page fault per 512 gaps).
        scratch[0] = first
        scratch[1:n] = gaps[g0:g0 + n - 1]
        np.cumsum(scratch[:n], out=scratch[:n])
        q = new(QueueIndex, "q")
        q.frombytes(scratch[:n].data.cast("B"))
        long[int(number[k])] = q
    short = ~is_long
    short_firsts = firsts[short]
    short_lasts = short_firsts + sums[short]
    short_jumps = short_firsts - np.concatenate((np.zeros(1, np.int64), short_lasts[:-1]))
    short_lengths = lengths[short]
    short_starts = np.cumsum(short_lengths) - short_lengths
    short_gaps = (gaps[~np.repeat(is_long, gap_counts)] if short.any()
                  else gaps[:0])  # no mask over every gap when every queue is long
    return _prefix_sum(short_starts, short_jumps, short_gaps), long


def _array(raw: bytes | memoryview) -> array[int]:
    out = array("q")
    out.frombytes(raw)
    return out


def latest(partition: int, records: Iterable[Sequence[Any]]
           ) -> Snapshot | None:
    """The latest complete snapshot among a snapshot partition's records (in log order), or
    None if there is none. Raises SnapshotError for one that is incomplete or corrupt."""
    manifest: dict[str, int | str] | None = None
    chunks: dict[tuple[int, int], bytes | None] = {}
    for key, value, *_ in records:
        try:
            parts = json.loads(key or b"")
        except ValueError:
            continue
        if parts == ["m", partition] and value is not None:
            try:
                manifest = json.loads(value)
            except ValueError:
                manifest = {"v": -1}
        elif isinstance(parts, list) and len(parts) == 4 and parts[:2] == ["c", partition]:
            chunks[(parts[2], parts[3])] = value
    if manifest is None:
        return None
    try:
        if manifest["v"] not in READABLE_VERSIONS:
            raise SnapshotError(f"snapshot format {manifest['v']} is not one of "
                                f"{READABLE_VERSIONS}")
        sid, count = int(manifest["id"]), int(manifest["chunks"])
        parts = []
        for i in range(count):
            part = chunks.get((sid, i))
            if part is None or not part.startswith(MAGIC):
                raise SnapshotError(f"snapshot {sid} lacks chunk {i} of {count}")
            parts.append(part[len(MAGIC):])
        body = b"".join(parts)
        if hashlib.sha256(body).hexdigest() != manifest["sha256"]:
            raise SnapshotError(f"snapshot {sid}: chunks do not match the manifest's digest")
        data = memoryview(_inflate(body))  # sliced below without copies
        size = int.from_bytes(data[:8], "little")
        text, lengths, counts, deleted, consumers, *more = msgspec.msgpack.decode(
            data[8:8 + size])
        fence, configs, work, *rest = more[0] if more else (0, [], [])
        tags = rest[0] if rest else []
        scheduled = rest[1] if len(rest) > 1 else []
        keys = KeySection(*map(bytes, rest[2])) if len(rest) > 2 else KeySection.empty()
        counts = _array(counts)
        raw = data[8 + size:]
        column: memoryview | None = None
        if manifest["v"] >= 4:
            _column(raw, counts)  # checked now, decoded by `build`
            offsets, column = array("q"), raw
        else:
            offsets = _array(raw)
        image = Snapshot(partition, int(manifest["data_position"]),
                         int(manifest["offsets_position"]), int(manifest["log_start"]),
                         _names(text, _array(lengths)),
                         counts, _array(deleted), offsets,
                         [(int(i), str(c), int(o), int(a)) for i, c, o, a in consumers],
                         int(fence), [tuple(x) for x in configs],
                         [tuple(x) for x in work], [tuple(x) for x in tags],
                         [tuple(x) for x in scheduled], keys, column)
        if not len(image.names) == len(image.counts) == len(image.deleted) or \
                (column is None and sum(image.counts) != len(image.offsets)):
            raise SnapshotError(f"snapshot {sid}: its columns do not agree")
        return image
    except (KeyError, TypeError, ValueError, zlib.error, msgspec.DecodeError) as exc:
        raise SnapshotError(f"unreadable snapshot: {exc!r}") from None


def manifest_of(records: Sequence[Sequence[Any]], partition: int
                ) -> dict[str, int] | None:
    """The last manifest among a snapshot partition's records (id and chunk count)."""
    found = None
    for key, value, *_ in records:
        if key == manifest_key(partition) and value is not None:
            try:
                found = json.loads(value)
            except ValueError:
                continue
    return found


def build(snapshot: Snapshot) -> tuple[QueueMap, SortedList]:
    """The queue index and the sorted names a snapshot describes. Blocking and pure: run it off
    the loop (the fresh state it is for is not touched by anyone until `restore`).

    The queues stay columns (`_Columns`): each is built into its object on its first lookup,
    a shard's rest when something walks the shard, the others by `QueueMap.warm_next` once the
    partition serves. Building a million queues' objects here took 0.8 s of a 1.1 s takeover
    (measured), most of it for queues nobody touches in the first second."""
    with memory.long_lived():
        return _build(snapshot)


def _build(snapshot: Snapshot) -> tuple[QueueMap, SortedList]:
    if snapshot.column is not None:
        offsets, long = decode_queues(snapshot.column, snapshot.counts, LONG_QUEUE)
    else:
        offsets, long = snapshot.decoded_offsets(), {}
    cold = _Columns(snapshot, offsets, long)
    queues = QueueMap(cold=cold)
    for number in range(cold.ordered, len(snapshot.names)):
        # Queues the capture found off the sorted walk (deletion markers, queues listed
        # meanwhile): few, and bisect needs order, so they are built now.
        queues[snapshot.names[number]] = cold.make(number)
    listed = list(compress(snapshot.names, snapshot.counts))
    for index, consumer, offset, acked_at in snapshot.consumers:
        name = snapshot.names[index]
        q = queues[name]
        if q.consumers is NO_CONSUMERS:
            q = queues.stateful(name, q)
            q.consumers = {}
            if not q.offsets:
                listed.append(name)
        q.consumers[consumer] = (offset, acked_at)
    return queues, SortedList(listed)


def _ordered_prefix(names: list[str]) -> int:
    """How many of `names`, from the first, are in strictly ascending order (a step of
    NAMES_STEP comparisons per C call)."""
    for i in range(0, len(names) - 1, NAMES_STEP):
        step = names[i:i + NAMES_STEP + 1]
        ascending = list(map(operator.lt, step, islice(step, 1, None)))
        if False in ascending:
            return i + ascending.index(False) + 1
    return len(names)


class _Columns:
    """A loaded snapshot's queues as its columns: `QueueMap`'s `ColdShards`. A queue becomes
    an object when the map is first asked for it (`take_one`: a bisect in the names), and a
    shard's remaining queues when the map needs them all (`take`). Only the names the capture
    walked in order (`ordered`, the listed queues: nearly all) are kept so; `_build` makes the
    others at once."""

    __slots__ = ("_bounds", "_counts", "_floors", "_left", "_long", "_names", "_offsets",
                 "_order", "_starts", "_taken", "_waiting", "ordered")

    def __init__(self, snapshot: Snapshot, offsets: array[int],
                 long: dict[int, QueueIndex]) -> None:
        names = self._names = snapshot.names
        self.ordered = ordered = _ordered_prefix(names)
        shard_of = np.empty(ordered, dtype=np.uint8)
        for i in range(0, ordered, NAMES_STEP):
            # A step at a time: hashing a million names in one C call held the GIL for 40 ms.
            # Masked in Python, not by numpy: numpy gives the GIL up and takes it back within
            # each call, and the loop's thread, which then never sees the holder wait out its
            # switch interval, got no turn for 50 ms (np.fromiter, np.array(...) & mask:
            # measured).
            step = names[i:min(i + NAMES_STEP, ordered)]
            shard_of[i:i + len(step)] = [h & (QUEUE_SHARDS - 1) for h in map(hash, step)]
        self._order = np.argsort(shard_of, kind="stable")  # queue numbers, shard by shard
        self._bounds = np.concatenate(([0], np.cumsum(np.bincount(
            shard_of, minlength=QUEUE_SHARDS)))).tolist()
        self._waiting: list[int] = np.diff(self._bounds).tolist()  # per shard, not taken
        self._taken = bytearray(ordered)
        self._left = ordered
        # A queue decoded as a long one holds its own array; the others' offsets follow one
        # another in `offsets`.
        sizes = np.frombuffer(snapshot.counts, dtype=np.int64)
        short = np.ones(len(names), dtype=bool)
        if long:
            short[np.fromiter(long, np.int64, len(long))] = False
        runs = np.where(short, sizes, 0)
        self._starts = array("q", (np.cumsum(runs) - runs).tobytes())
        self._counts, self._floors = snapshot.counts, snapshot.deleted
        self._offsets, self._long = offsets, long

    def make(self, number: int) -> QueueIndex:
        """Queue `number`'s index, from its columns."""
        return self._make(number, self._starts[number], self._counts[number],
                          self._floors[number])

    def _make(self, number: int, start: int, size: int, deleted_before: int) -> QueueIndex:
        q = self._long.get(number) if self._long else None
        if q is None:
            new: Any = array.__new__  # QueueIndex.__new__'s work without its Python frame
            q = new(StatefulQueueIndex if deleted_before else QueueIndex, "q",
                    self._offsets[start:start + size])
        elif deleted_before:
            q = StatefulQueueIndex(q)
        if deleted_before:
            q.deleted_before = deleted_before
            q.consumers = NO_CONSUMERS
        return q

    def pending(self, shard: int) -> bool:
        return self._waiting[shard] > 0

    def left(self) -> int:
        return self._left

    def take_one(self, shard: int, name: str) -> QueueIndex | None:
        if not self._waiting[shard]:
            return None
        i = bisect_left(self._names, name, 0, self.ordered)
        if i == self.ordered or self._names[i] != name or self._taken[i]:
            return None
        self._taken[i] = 1
        self._forget(shard, 1)
        return self.make(i)

    def take(self, shard: int, into: dict[str, QueueIndex]) -> None:
        if not self._waiting[shard]:
            return
        numbers = self._order[self._bounds[shard]:self._bounds[shard + 1]]
        numbers = numbers[np.frombuffer(self._taken, dtype=np.uint8)[numbers] == 0]
        # The shard's columns read through numpy views at once: an item read at a time took
        # 60% longer (1.4 s against 0.86 s for a million queues, measured).
        columns = (np.frombuffer(c, dtype=np.int64)[numbers].tolist()
                   for c in (self._starts, self._counts, self._floors))
        names, make = self._names, self._make
        for number, start, size, deleted_before in zip(numbers.tolist(), *columns,
                                                       strict=True):
            into[names[number]] = make(number, start, size, deleted_before)
        self.drop(shard)

    def drop(self, shard: int) -> None:
        self._forget(shard, self._waiting[shard])

    def _forget(self, shard: int, count: int) -> None:
        self._waiting[shard] -= count
        self._left -= count


def restore(state: PartitionState, snapshot: Snapshot, built: tuple[QueueMap, SortedList],
            window: IdempotencyWindow | None = None) -> None:
    """Hand a fresh `state` what `build` made of `snapshot`, and the idempotency `window`
    restored from it (made here if not given: `IdempotencyWindow.restore` off the loop for
    many keys); the tail then continues at `snapshot.data_position` and the offset replay at
    `snapshot.offsets_position`."""
    if window is None:
        window = IdempotencyWindow.restore(state.idempotency.window_ms, snapshot.keys, now_ms())
    state.idempotency = window
    state.index = PartitionIndex(*built, snapshot.log_start)
    state.fence = snapshot.fence
    state.leases.restore(snapshot.configs, snapshot.work)
    state.schedule.restore(snapshot.scheduled)
    state.tags = TagIndex.restore(snapshot.tags)
    state.frontier.start_at(snapshot.data_position)
    state.offsets_position = snapshot.offsets_position
