"""A child's share of its parent's final snapshot, when a layout grows (ADR 19).

Partition P of a layout with N partitions splits into the children `P + j * N` of the next
layout, with k * N partitions. A child adopts the queues that route to it
(`partition_for(queue, k * N)`) by loading the parent's final snapshot filtered to them:
`split` makes that filtered image, a pure function of the decoded parent image, run off the
loop. Every section goes with its queue, except what is not a queue's:

- the positions (P, O, the log start) and the fence name offsets and owner generations of
  the PARENT's data and offset partitions, not the child's: they come back apart, in
  `ParentPositions`, and the child's image holds 0 for each: nothing of the child's own
  partitions is in it, so its owner reads both from their beginning (its data partition's
  first vqueues offset is `layouts.tag(layout, 0)`) and replays the fences its own offset
  partition holds;
- idempotency keys are fingerprints of (queue, key), which do not name their queue: a key
  goes with the queue whose record (or scheduled record) sits at the key's offset. A key
  whose record the parent no longer holds (trimmed, deleted, a scheduled record already
  moved) is kept by every child: a lookup only ever fingerprints the child's own queues, so
  another queue's key never matches there, and it leaves with the window;
- prefix consumers are the cluster's, defined in the assignment topic and in no snapshot:
  nothing to split. A queue's consumer that a prefix consumer made is a row of its queue.

A lease window's row keeps its keys of the parent's offset partition (`log_keys`): they make
the child's owner, at its fence, checkpoint every adopted window into its own offset
partition, as after a takeover (`window_writes.takeover_checkpoints`); the tombstones it
writes for those keys land where they never were, which is harmless.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import compress
from typing import Any, TypeVar

import numpy as np

from vqueues.hashing import partitions_for
from vqueues.snapshot.image import Snapshot
from vqueues.state.idempotency import KeySection

Row = TypeVar("Row", bound=tuple[Any, ...])


@dataclass(frozen=True, slots=True)
class ParentPositions:
    """Where the parent's final snapshot stands in the parent's own partitions: data position
    P, offset-topic position O, log start, and the fence of its offset partition."""

    partition: int
    data_position: int
    offsets_position: int
    log_start: int
    fence: int


@dataclass(frozen=True, slots=True)
class Split:
    """A child's image (positions and fence 0: see the module) and its parent's positions."""

    image: Snapshot
    parent: ParentPositions


def split(parent: Snapshot, child: int, partitions: int) -> Split:
    """The image of partition `child` of a layout with `partitions` partitions: exactly
    `parent`'s state for the queues that route to `child` (and the keys no queue of the
    parent holds). Blocking (numpy over every offset and name): run it off the loop."""
    if partitions < 1 or not 0 <= child < partitions:
        raise ValueError(f"partition {child} is not one of {partitions}")
    routes = partitions_for(parent.names, partitions) == child
    flat = np.frombuffer(parent.decoded_offsets(), dtype=np.int64)
    counts = np.frombuffer(parent.counts, dtype=np.int64)
    per_offset = np.repeat(routes, counts)
    image = Snapshot(child, 0, 0, 0)
    image.names = list(compress(parent.names, routes.tolist()))
    image.counts = _array(counts[routes])
    image.deleted = _array(np.frombuffer(parent.deleted, dtype=np.int64)[routes])
    image.offsets = _selected(flat, per_offset)
    number = (np.cumsum(routes) - 1).tolist()  # a kept queue's number in the child
    kept = routes.tolist()
    image.consumers = [(number[i], c, off, at) for i, c, off, at in parent.consumers
                       if kept[i]]
    image.configs, _ = _by_queue(parent.configs, child, partitions)
    image.windows, _ = _by_queue(parent.windows, child, partitions)
    image.tags, _ = _by_queue(parent.tags, child, partitions)
    image.scheduled, elsewhere = _by_queue(parent.scheduled, child, partitions)
    image.keys = _keys(parent.keys, flat, per_offset, [r[1] for r in elsewhere])
    return Split(image, ParentPositions(parent.partition, parent.data_position,
                                        parent.offsets_position, parent.log_start,
                                        parent.fence))


def _array(values: Any) -> array[int]:
    out = array("q")
    out.frombytes(np.ascontiguousarray(values, dtype=np.int64).tobytes())
    return out


def _selected(flat: Any, keep: Any) -> array[int]:
    """The offsets `keep` marks, written once, straight into the array returned."""
    out = array("q", [0]) * int(np.count_nonzero(keep))
    if len(out):
        np.compress(keep, flat, out=np.frombuffer(out, dtype=np.int64))
    return out


def _by_queue(rows: Sequence[Row], child: int, partitions: int
              ) -> tuple[list[Row], list[Row]]:
    """The rows (queue first) of the child's queues, and the others'."""
    routes = (partitions_for([r[0] for r in rows], partitions) == child).tolist()
    return (list(compress(rows, routes)),
            list(compress(rows, [not r for r in routes])))


def _keys(section: KeySection, flat: Any, mine: Any, scheduled_elsewhere: list[int]
          ) -> KeySection:
    """The keys whose record is not another child's, in the window's order: not at an offset
    of `flat` that is not `mine`, nor at the id of another child's scheduled record."""
    offsets = np.frombuffer(section.offsets, dtype=np.int64)
    if not len(offsets):
        return section
    # Only the records in the keys' span can match: usually the few recent ones.
    lo, hi = offsets.min(), offsets.max()
    others = np.concatenate((flat[(flat >= lo) & (flat <= hi) & ~mine],
                             np.array(scheduled_elsewhere, dtype=np.int64)))
    keep = ~np.isin(offsets, others)
    if keep.all():
        return section
    fingerprints = np.frombuffer(section.fingerprints, dtype=np.uint8).reshape(-1, 16)
    return KeySection(fingerprints[keep].tobytes(), offsets[keep].tobytes(),
                      np.frombuffer(section.payloads, dtype=np.uint64)[keep].tobytes(),
                      np.frombuffer(section.at_ms, dtype=np.int64)[keep].tobytes())
