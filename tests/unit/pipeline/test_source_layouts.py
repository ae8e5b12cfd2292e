"""The Spark source across layouts (ADR 19), its driver side over a fake Kafka client: the
topics a pattern reads, where new topics start, deleted topics, a checkpoint from before
layouts, and the layouts' partition counts from the assignment topic."""

import re

import pytest

pytest.importorskip("pyspark", reason="the pipeline extra (pyspark) is not installed")

from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from vqueues.layouts import Layout, encode_layout, layout_of_topic, topic_pattern
from vqueues.pipeline.source import (
    Reading,
    Subscription,
    VQueuesKafkaSource,
    VQueuesKafkaStreamReader,
    from_checkpoint,
    resolve,
    unread_when_gone,
)

pytestmark = pytest.mark.unit
BOOT = {"kafka.bootstrap.servers": "127.0.0.1:1"}


def test_the_pattern_matches_the_topic_and_its_layouts_only():
    pattern = topic_pattern("vq-data")
    for name in ("vq-data", "vq-data.l1", "vq-data.l12", "vq-data.l31"):
        assert re.fullmatch(pattern, name), name
    for name in ("vq-data.l0", "vq-data.l01", "vq-data.l", "vq-datax", "xvq-data", "vq-data.l1.x",
                 "vq-offsets.l1", "vq-data-l1", "vq_data"):
        assert not re.fullmatch(pattern, name), name
    assert [layout_of_topic(n) for n in ("vq-data", "vq-data.l1", "vq-data.l12")] == [0, 1, 12]
    with pytest.raises(ValueError, match="layout"):
        topic_pattern("events.l2")  # its layout 0 would read as layout 2 of "events"


class FakeKafka:
    """The driver's Kafka client: topics with their earliest and end offsets."""

    def __init__(self, topics):
        self.offsets = topics  # name -> [(earliest, end) per partition]

    def topics(self):
        return {t: list(range(len(parts))) for t, parts in self.offsets.items()}

    def earliest(self, partitions, *, topic):
        return {p: self.offsets[topic][p][0] for p in partitions}

    def ends(self, partitions, *, topic):
        return {p: self.offsets[topic][p][1] for p in partitions}

    def close(self):
        pass


def stream(kafka, sub, starting="earliest", reading=None, max_per_trigger=None):
    reader = VQueuesKafkaStreamReader({}, sub, starting, max_per_trigger, None,
                                      reading or Reading())
    reader.topics.client = kafka
    return reader


PATTERN = Subscription(pattern=topic_pattern("vq-data"))


def test_a_topic_that_appears_while_the_query_runs_is_read_from_its_earliest_offset():
    kafka = FakeKafka({"vq-data": [(0, 5), (0, 7)], "other": [(0, 9)]})
    reader = stream(kafka, PATTERN, starting="latest")
    start = reader.initialOffset()
    assert start == {"vq-data": {"0": 5, "1": 7}}
    kafka.offsets["vq-data.l1"] = [(2, 6), (0, 4), (0, 0), (0, 1)]  # created, written to
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {"vq-data": {"0": 5, "1": 7}, "vq-data.l1": {"0": 6, "1": 4, "2": 0, "3": 1}}
    ranges = reader.partitions(start, end)
    assert sorted((r.topic, r.partition, r.start, r.end) for r in ranges) == [
        ("vq-data.l1", 0, 2, 6), ("vq-data.l1", 1, 0, 4), ("vq-data.l1", 3, 0, 1)]


def test_max_offsets_per_trigger_splits_over_every_topic_by_backlog():
    kafka = FakeKafka({"vq-data": [(0, 100)], "vq-data.l1": [(0, 300)]})
    reader = stream(kafka, PATTERN, max_per_trigger=40)
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadMaxRows(40))
    assert end == {"vq-data": {"0": 10}, "vq-data.l1": {"0": 30}}


def test_a_checkpoint_from_before_layouts_resumes_as_layout_0s_offsets():
    # What the source wrote before it read several topics (a checkpoint's offsets/<n>).
    legacy = {"3": 5, "0": 5, "1": 5, "2": 5}
    kafka = FakeKafka({"vq-data": [(0, 8)] * 4, "vq-data.l1": [(0, 3)] * 8})
    reader = stream(kafka, PATTERN)
    end = reader.latestOffset(legacy, ReadAllAvailable())
    assert end["vq-data"] == {"0": 8, "1": 8, "2": 8, "3": 8}
    ranges = reader.partitions(legacy, end)
    assert {(r.topic, r.start, r.end) for r in ranges} == {("vq-data", 5, 8), ("vq-data.l1", 0, 3)}
    assert from_checkpoint(legacy, lambda: "t") == {"t": {"0": 5, "1": 5, "2": 5, "3": 5}}
    nested = {"vq-data": {"0": 1}, "vq-data.l1": {"0": 2}}
    assert from_checkpoint(nested, lambda: pytest.fail("not a legacy checkpoint")) == nested
    with pytest.raises(ValueError, match="offsets"):
        from_checkpoint({"vq-data": {"0": 1}, "1": 2}, lambda: "t")


def test_a_legacy_checkpoint_under_a_pattern_matching_two_first_layouts_is_refused():
    kafka = FakeKafka({"a": [(0, 1)], "b": [(0, 1)]})
    reader = stream(kafka, Subscription(pattern="a|b"))
    with pytest.raises(RuntimeError, match="one topic"):
        reader.latestOffset({"0": 1}, ReadAllAvailable())


def test_a_deleted_topic_read_to_its_end_is_dropped_and_one_not_read_fails_the_query():
    kafka = FakeKafka({"vq-data": [(0, 5)], "vq-data.l1": [(0, 9)]})
    reader = stream(kafka, PATTERN)
    end = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    del kafka.offsets["vq-data"]  # retired once read
    assert reader.latestOffset(end, ReadAllAvailable()) == {"vq-data.l1": {"0": 9}}
    # A deleted topic this query had not read to its end: records lost.
    behind = {"vq-data": {"0": 3}, "vq-data.l1": {"0": 9}}
    with pytest.raises(RuntimeError, match="failOnDataLoss=false"):
        reader.latestOffset(behind, ReadAllAvailable())
    lenient = stream(kafka, PATTERN, reading=Reading(fail_on_data_loss=False))
    assert lenient.latestOffset(behind, ReadAllAvailable()) == {"vq-data.l1": {"0": 9}}
    assert unread_when_gone(behind, {"vq-data.l1": {"0": 9}}, {"vq-data": {"0": 3}}) == {}


def test_queues_route_with_each_layouts_partition_count_from_the_assignment_topic(monkeypatch):
    from vqueues.hashing import partition_for
    from vqueues.kafka import logs

    kafka = FakeKafka({"vq-data": [(0, 10)] * 4, "vq-data.l1": [(0, 10)] * 8,
                       "vq-assignments": [(0, 1)]})
    # The assignment topic: claims and, once written, the layout record.
    records: list[tuple[bytes, bytes, None]] = []
    reads = []

    def read_to_end(conf, topic, partitions, starts=None):
        reads.append(topic)
        return {0: (list(records), len(records))}

    monkeypatch.setattr(logs, "read_to_end", read_to_end)
    reader = stream(kafka, PATTERN, reading=Reading(queues=("orders",)))
    records.append((b"3", b'{"owner": "n1"}', None))
    start = reader.initialOffset()
    # The layout's topic exists but its layout record does not yet: not read until it does.
    assert start == {"vq-data": {"0": 0, "1": 0, "2": 0, "3": 0}}
    records.append((*encode_layout(Layout(1, 8), 0), None))
    end = reader.latestOffset(start, ReadAllAvailable())
    assert set(end) == {"vq-data", "vq-data.l1"} and end["vq-data.l1"]["0"] == 10
    ranges = reader.partitions(start, end)
    assert {(r.topic, r.partition) for r in ranges} == {
        ("vq-data", partition_for("orders", 4)), ("vq-data.l1", partition_for("orders", 8))}
    assert reads == ["vq-assignments", "vq-assignments"]  # read again only for a new layout
    reader.latestOffset(end, ReadAllAvailable())
    assert len(reads) == 2


def test_a_missing_assignment_topic_is_named():
    kafka = FakeKafka({"vq-data": [(0, 1)], "vq-data.l1": [(0, 1)]})
    reader = stream(kafka, PATTERN, reading=Reading(queues=("q",), assignment_topic="mine"))
    with pytest.raises(RuntimeError, match="assignmentTopic"):
        reader.initialOffset()


def test_starting_offsets_per_topic_under_a_pattern():
    earliest = {"vq-data": {"0": 0, "1": 2}, "vq-data.l1": {"0": 1}}
    ends = {"vq-data": {"0": 9, "1": 9}, "vq-data.l1": {"0": 9}}
    spec = {"vq-data": {"0": 4, "1": -1}}
    assert resolve(spec, earliest, ends, earliest) == {"vq-data": {"0": 4, "1": 9},
                                                       "vq-data.l1": {"0": 1}}
    src = VQueuesKafkaSource({**BOOT, "subscribePattern": topic_pattern("vq-data"),
                              "startingOffsets": '{"vq-data.l1": {"0": -2}}'})
    assert src.starting == {"vq-data.l1": {"0": -2}}
    with pytest.raises(ValueError, match="does not read"):
        VQueuesKafkaSource({**BOOT, "subscribePattern": topic_pattern("vq-data"),
                            "startingOffsets": '{"vq-offsets": {"0": 1}}'})
    with pytest.raises(ValueError, match="not both"):
        VQueuesKafkaSource({**BOOT, "subscribePattern": "a", "subscribe": "a"})
    with pytest.raises(ValueError, match="regular expression"):
        VQueuesKafkaSource({**BOOT, "subscribePattern": "a("})
