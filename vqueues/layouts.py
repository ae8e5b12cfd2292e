"""Layouts: the generations of a cluster's three topics, and the offsets that name a record in
any of them (ADR 19).

A cluster starts on layout 0: the configured data, offset and snapshot topics with N
partitions. Growing it to k * N partitions creates layout 1: three new topics named after the
configured ones (`vq-data.l1`, ...) with k * N partitions each. Each partition P of a layout
splits into k children in the next, `P + j * N` for j in 0..k-1: exactly the partitions its
queues route to under k * N, since `h % (k * N) % N == h % N`.

A record's **vqueues offset** is its Kafka offset tagged with its layout in the high bits:
`(layout << TAG_BITS) | kafka_offset`. Layout 0's offsets are the Kafka offsets themselves, so
every value a cluster handed out before its first growth stays valid; a queue's records in a
later layout all sort after its records in an earlier one, so a reader's position moves
forward across a growth without a gap or a repeat. 48 bits hold 2.8e14 offsets per partition,
and offsets up to layout 31 stay below 2**53, exact in a JavaScript number.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from vqueues.hashing import partition_for

TAG_BITS = 48
OFFSET_MASK = (1 << TAG_BITS) - 1
MAX_LAYOUT = 31  # (31 << 48) | OFFSET_MASK < 2**53: exact as a JSON number in every client

_SUFFIX = re.compile(r"\.l([1-9][0-9]*)$")


def tag(layout: int, offset: int) -> int:
    """The vqueues offset of Kafka offset `offset` in `layout`'s data topic."""
    return (layout << TAG_BITS) | offset if layout else offset


def layout_of(offset: int) -> int:
    """The layout whose data topic holds the record a vqueues offset names."""
    return offset >> TAG_BITS


def kafka_offset(offset: int) -> int:
    """The Kafka offset inside its layout's data topic of a vqueues offset."""
    return offset & OFFSET_MASK


def topic_name(base: str, layout: int) -> str:
    """Layout `layout`'s name for the configured topic `base` (layout 0 uses `base` itself)."""
    return base if layout == 0 else f"{base}.l{layout}"


def layout_of_topic(name: str) -> int:
    """The layout of a topic named by `topic_name`: the number after `.l`, else 0."""
    found = _SUFFIX.search(name)
    return int(found.group(1)) if found else 0


def topic_pattern(base: str) -> str:
    """A regular expression whose whole match is `base` or one of its layouts' names, the same
    in Python's `re` and Java's `Pattern` (Spark's `subscribePattern`)."""
    if layout_of_topic(base):
        raise ValueError(f"topic {base!r} ends like a layout's name (.l<n>): the configured "
                         f"topics' names must not")
    return re.escape(base) + r"(\.l[1-9][0-9]*)?"


@dataclass(frozen=True, slots=True)
class Layout:
    """One generation of the three topics: its number and partition count."""

    number: int
    partitions: int

    def topics(self, data: str, offsets: str, snapshots: str) -> tuple[str, str, str]:
        return (topic_name(data, self.number), topic_name(offsets, self.number),
                topic_name(snapshots, self.number))

    def partition_of(self, queue: str) -> int:
        return partition_for(queue, self.partitions)

    def parent(self, partition: int, previous: Layout) -> int:
        """The partition of `previous` whose queues `partition` (of this layout) took over."""
        return partition % previous.partitions

    def children(self, partition: int, following: Layout) -> list[int]:
        """The partitions of `following` that `partition`'s queues route to."""
        k = following.partitions // self.partitions
        return [partition + j * self.partitions for j in range(k)]


def check_growth(current: Layout, partitions: int) -> str | None:
    """Why growing `current` to `partitions` is refused, or None if it is allowed."""
    if current.number >= MAX_LAYOUT:
        return f"a cluster grows at most {MAX_LAYOUT} times (offsets must stay below 2**53)"
    if partitions <= current.partitions:
        return (f"--partitions {partitions} is not above the current {current.partitions}: "
                f"a cluster only grows")
    if partitions % current.partitions:
        return (f"--partitions {partitions} is not a multiple of the current "
                f"{current.partitions}: each partition must split into whole children, so "
                f"that every queue of a child comes from one parent")
    return None


# Headers of the records a growth adds to the data topics, which are not queue records of their
# own: the cut marker (keyless) closing an old partition, and a forwarded copy of a record that
# reached an old partition after its marker (the original stays there).
CUT_HEADER = "vq-layout-cut"
FORWARDED_HEADER = "vq-forwarded-from"

# The assignment topic's records for layouts (beside the claims, keyed by partition number):
#   b"layout/1" -> {"v": 1, "layout": 1, "partitions": 32, "ts": ms}
LAYOUT_KEY_PREFIX = b"layout/"


def encode_layout(layout: Layout, ts_ms: int) -> tuple[bytes, bytes]:
    return LAYOUT_KEY_PREFIX + str(layout.number).encode(), json.dumps(
        {"v": 1, "layout": layout.number, "partitions": layout.partitions, "ts": ts_ms},
        separators=(",", ":")).encode()


def decode_layout(key: bytes | None, value: bytes | None) -> Layout | None:
    """The layout a record of the assignment topic announces, or None if it is not one."""
    if not key or not key.startswith(LAYOUT_KEY_PREFIX) or not value:
        return None
    try:
        body = json.loads(value)
        number, partitions = int(body["layout"]), int(body["partitions"])
    except (ValueError, TypeError, KeyError):
        return None
    if key != LAYOUT_KEY_PREFIX + str(number).encode() or not 0 < number <= MAX_LAYOUT \
            or partitions < 1:
        return None
    return Layout(number, partitions)


# A partition's cut for the next layout (ADR 19), beside the layout records:
#   b"cut/1/3/node-a/7" -> {"v": 1, "layout": 1, "partition": 3, "marker": C, "snapshot": id,
#                          "node": "node-a", "generation": 7, "ts": ms}
# `layout` is the layout being entered, `partition` the old layout's partition, `marker` the
# (tagged) offset of the marker in its data partition, `snapshot` the id of its final snapshot.
# Each cut has a key of its own (compaction keeps them all): the first in the log counts.
CUT_KEY_PREFIX = b"cut/"


@dataclass(frozen=True, slots=True)
class Cut:
    layout: int
    partition: int
    marker: int
    snapshot: int
    node: str


def encode_cut(cut: Cut, generation: int, ts_ms: int) -> tuple[bytes, bytes]:
    key = f"cut/{cut.layout}/{cut.partition}/{cut.node}/{generation}".encode()
    return key, json.dumps({"v": 1, "layout": cut.layout, "partition": cut.partition,
                            "marker": cut.marker, "snapshot": cut.snapshot, "node": cut.node,
                            "generation": generation, "ts": ts_ms},
                           separators=(",", ":")).encode()


def decode_cut(key: bytes | None, value: bytes | None) -> Cut | None:
    """The cut a record of the assignment topic announces, or None if it is not one."""
    if not key or not key.startswith(CUT_KEY_PREFIX) or not value:
        return None
    try:
        body = json.loads(value)
        cut = Cut(int(body["layout"]), int(body["partition"]), int(body["marker"]),
                  int(body["snapshot"]), str(body["node"]))
    except (ValueError, TypeError, KeyError):
        return None
    if not key.startswith(f"cut/{cut.layout}/{cut.partition}/".encode()) \
            or not 0 < cut.layout <= MAX_LAYOUT:
        return None
    return cut
