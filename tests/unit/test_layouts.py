"""Layouts (ADR 19): tagged offsets, splits, the cluster map of a layout, and reading records
of earlier layouts."""

from collections.abc import Sequence

import pytest

from vqueues.hashing import partition_for
from vqueues.layouts import (
    MAX_LAYOUT,
    Layout,
    check_growth,
    decode_layout,
    encode_layout,
    kafka_offset,
    layout_of,
    tag,
    topic_name,
)
from vqueues.ownership.cluster_map import ClusterMap, encode_claim, encode_release
from vqueues.queues.layered_fetcher import LayeredFetcher
from vqueues.records import Record


def test_tags_order_every_layout_after_the_ones_before_and_stay_exact_in_javascript() -> None:
    assert tag(0, 12345) == 12345
    assert (layout_of(tag(3, 77)), kafka_offset(tag(3, 77))) == (3, 77)
    assert tag(1, 0) > tag(0, (1 << 48) - 1)
    assert tag(MAX_LAYOUT, (1 << 48) - 1) < 2**53
    assert topic_name("vq-data", 0) == "vq-data" and topic_name("vq-data", 2) == "vq-data.l2"


def test_children_are_exactly_where_the_queues_route() -> None:
    old, new = Layout(0, 4), Layout(1, 16)
    for i in range(2000):
        q = f"queue-{i}"
        parent = old.partition_of(q)
        assert new.partition_of(q) in old.children(parent, new)
        assert new.parent(new.partition_of(q), old) == parent


@pytest.mark.parametrize("partitions,why", [
    (4, "not above"), (6, "not a multiple"), (10, "not a multiple")])
def test_a_growth_must_split_each_partition_whole(partitions: int, why: str) -> None:
    assert why in (check_growth(Layout(0, 4), partitions) or "")
    assert check_growth(Layout(0, 4), 8) is None
    assert "at most" in (check_growth(Layout(MAX_LAYOUT, 4), 8) or "")


def test_layout_records_round_trip_and_refuse_what_is_not_one() -> None:
    key, value = encode_layout(Layout(2, 32), 1)
    assert decode_layout(key, value) == Layout(2, 32)
    assert decode_layout(b"layout/3", value) is None  # key and body disagree
    assert decode_layout(b"7", value) is None
    assert decode_layout(key, b"{") is None


def test_a_layouts_cluster_map_reads_its_own_claims_only() -> None:
    old, new = ClusterMap(4), ClusterMap(8, layout=1)
    records = [encode_claim(1, "a", "http://a", 1), encode_claim(5, "b", "http://b", 2, 1),
               encode_layout(Layout(1, 8), 1)]
    old.apply(records)
    new.apply(records)
    assert sorted(old.owners) == [1] and sorted(new.owners) == [5]
    assert new.owners[5].node == "b" and new.layouts[1] == Layout(1, 8)
    assert old.layouts[1] == Layout(1, 8)
    new.apply([encode_release(5, "b", 2, 1)])
    assert new.owners == {}


class _Fetcher:
    def __init__(self, layout: int, records: dict[int, dict[int, bytes]], low: int = 0) -> None:
        self.layout, self.records, self.low = layout, records, low
        self.calls: list[tuple[int, list[int]]] = []

    def fetch(self, partition: int, offsets: Sequence[int]) -> dict[int, Record]:
        self.calls.append((partition, list(offsets)))
        held = self.records.get(partition, {})
        return {o: Record(o, 0, held[kafka_offset(o)], ()) for o in offsets
                if kafka_offset(o) in held}

    def high_watermark(self, partition: int) -> int:
        return tag(self.layout, max(self.records.get(partition, {0: b""}), default=-1) + 1)

    def log_start(self, partition: int) -> int:
        return tag(self.layout, self.low)


def test_records_of_an_earlier_layout_are_read_where_the_queue_had_them() -> None:
    q = next(f"q{i}" for i in range(100) if partition_for(f"q{i}", 8) >= 4)
    child, parent = partition_for(q, 8), partition_for(q, 4)
    old = _Fetcher(0, {parent: {5: b"old"}})
    new = _Fetcher(1, {child: {0: b"new"}})
    fetcher = LayeredFetcher({0: (Layout(0, 4), old), 1: (Layout(1, 8), new)}, 1)
    found = fetcher.fetch(child, [5, tag(1, 0)])
    assert {o: r.value for o, r in found.items()} == {5: b"old", tag(1, 0): b"new"}
    assert old.calls == [(parent, [5])] and new.calls == [(child, [tag(1, 0)])]
    assert fetcher.high_watermark(child) == tag(1, 1)
    assert fetcher.log_start(child) == 0  # the old layout still holds records
    old.low = 6  # retention emptied the parent: the child's own start counts
    assert fetcher.log_start(child) == tag(1, 0)


def test_a_record_of_an_earlier_layout_is_cached_under_its_own_partition() -> None:
    """The cache a node kept across its restart on the new layout still serves the adopted
    queues' older records: they are looked up where the node cached them."""
    old, new = _Fetcher(0, {}), _Fetcher(1, {})
    fetcher = LayeredFetcher({0: (Layout(0, 4), old), 1: (Layout(1, 8), new)}, 1)
    assert fetcher.home(6, 12) == 2  # layout 0's offset 12: partition 6 % 4 there
    assert fetcher.home(6, tag(1, 12)) == 6
