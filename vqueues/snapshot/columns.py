"""The offsets column of a snapshot: every queue's offsets, delta-encoded (`encode_offsets`),
decoded into one flat array or straight into the queues' own arrays (`decode_queues`)."""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from vqueues.snapshot.format import SnapshotError
from vqueues.state.queue_index import QueueIndex

# The narrowest of these that holds every gap: (type, largest value).
_GAP_TYPES: tuple[tuple[str, int], ...] = (
    ("<u1", 2**8 - 1), ("<u2", 2**16 - 1), ("<u4", 2**32 - 1), ("<i8", 2**63 - 1))
SUM_WINDOW = 1 << 20  # gaps summed per `reduceat` call (it widens them all first)


def _starts(counts: array[int]) -> Any:
    """Where each queue with offsets begins in the flat offsets column."""
    sizes = np.frombuffer(counts, dtype=np.int64)
    ends = np.cumsum(sizes)
    return (ends - sizes)[sizes > 0]


def encode_offsets(offsets: array[int], counts: array[int]) -> bytes:
    """The flat offsets column, delta-encoded so that takeover time does not grow with the
    records (issue 8). One type byte, each non-empty queue's jump from the
    previous queue's last offset (int64), then the gaps between a queue's consecutive offsets
    in the narrowest unsigned type that holds them all: one byte per record when a queue's
    records lie close together, and runs of equal gaps compress to almost nothing."""
    return b"".join(encode_offset_parts([offsets], counts))


def encode_offset_parts(parts: Sequence[array[int]], counts: array[int]) -> Iterator[bytes]:
    """`encode_offsets` of the parts' offsets joined, a part at a time: never a copy of the
    whole column, which would triple live memory and hold the GIL over fresh pages; a part is
    at most CAPTURE_OFFSETS long."""
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


def column_parts(raw: bytes | memoryview, counts: array[int]) -> tuple[Any, Any, Any]:
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
    # Computed in place in the array returned: each extra copy costs the kernel fresh pages.
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
    return _prefix_sum(*column_parts(raw, counts))


def _run_sums(gaps: Any, starts: Any, counts: Any) -> Any:
    """Each run of `gaps` (from starts[i], counts[i] long) summed, as int64. `reduceat` first
    copies its whole input into int64 (eight times the pages of one-byte gaps), so it runs
    over windows of SUM_WINDOW gaps, and a run longer than that is summed alone (`sum` widens
    in small buffers)."""
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
    starts, jumps, gaps = column_parts(raw, counts)
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
        # gaps into a fresh int64 array of their own.
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
