"""`vqueues topics grow` (vqueues.kafka.topics.grow): which layout is current, the refusals, the
next layout's topics and configs, and the record written only once they are listed, through a
fake admin and a fake assignment topic (ADR 19)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from vqueues import cli, logs
from vqueues.cli import build_parser
from vqueues.errors import BrokerError, ConfigError
from vqueues.kafka import admin, topics
from vqueues.kafka.admin import TopicSpec
from vqueues.layouts import MAX_LAYOUT, Cut, Layout, decode_layout, encode_cut, encode_layout
from vqueues.settings import Settings

SETTINGS = Settings(data_topic="d", offset_topic="o", assignment_topic="a", snapshot_topic="s")
COMPACT = topics.compaction_config(SETTINGS)


class Brokers:
    """Topics with a partition count, a config and a replica count; `events` records each
    creation and each record written, in order. `listed`: whether a created topic shows in
    the metadata (False: the brokers never list it)."""

    def __init__(self, counts: Mapping[str, int], replicas: int = 3,
                 retention_ms: str = "86400000", listed: bool = True) -> None:
        self.counts: dict[str, int] = dict(counts)
        self.configs: dict[str, dict[str, str]] = {
            n: ({"retention.ms": retention_ms, "cleanup.policy": "delete"} if n == "d" else
                dict(COMPACT)) for n in counts}
        self.replicas = dict.fromkeys(counts, replicas)
        self.listed = listed
        self.events: list[object] = []
        self.records: list[tuple[bytes | None, bytes | None]] = []

    # The admin -------------------------------------------------------------------------------
    def partition_counts(self, names: Sequence[str], timeout_s: float = 10.0
                         ) -> dict[str, int | None]:
        return {n: self.counts.get(n) for n in names}

    def replication_factors(self, names: Sequence[str], timeout_s: float = 10.0
                            ) -> dict[str, int | None]:
        return {n: self.replicas.get(n) for n in names}

    def topic_configs(self, names: Sequence[str], keys: Sequence[str], timeout_s: float = 10.0
                      ) -> dict[str, dict[str, str]]:
        return {n: {k: v for k, v in self.configs[n].items() if k in keys} for n in names}

    def set_topic_configs(self, topic: str, config: Mapping[str, str],
                          timeout_s: float = 30.0) -> None:
        self.configs[topic].update(config)

    def create(self, specs: Sequence[TopicSpec], timeout_s: float = 30.0) -> dict[str, str]:
        out = {}
        for s in specs:
            if s.name in self.configs:
                out[s.name] = "exists"
                continue
            out[s.name] = "created"
            self.events.append(s)
            self.configs[s.name] = dict(s.config)
            self.replicas[s.name] = s.replication_factor
            if self.listed:
                self.counts[s.name] = s.partitions
        return out

    # The assignment topic --------------------------------------------------------------------
    def read(self) -> list[tuple[bytes | None, bytes | None]]:
        return list(self.records)

    def append(self, key: bytes, value: bytes) -> None:
        self.events.append(decode_layout(key, value))
        self.records.append((key, value))

    def layouts(self) -> list[Layout | None]:
        return [decode_layout(k, v) for k, v in self.records]


def four() -> Brokers:
    """A cluster on layout 0 with 4 partitions (and a claim in its assignment topic)."""
    b = Brokers({"d": 4, "o": 4, "s": 4, "a": 1})
    b.records.append((b"0", b'{"node": "n1"}'))
    return b


def grow(b: Brokers, partitions: int, **kw: object) -> str:
    return topics.grow(b, b, SETTINGS, partitions, now_ms=5, wait_s=0.05, interval_s=0.01,
                       **kw)  # type: ignore[arg-type]


def test_growing_layout_0_creates_the_three_topics_then_writes_the_record() -> None:
    b = four()
    line = grow(b, 8)
    assert line == ("layout 1: 8 partitions, from 4 in layout 0: d.l1 created, o.l1 created, "
                    "s.l1 created; wrote layout/1 to a")
    created = [e for e in b.events if isinstance(e, TopicSpec)]
    assert [(s.name, s.partitions, s.replication_factor) for s in created] == [
        ("d.l1", 8, 3), ("o.l1", 8, 3), ("s.l1", 8, 3)]
    # The configs `topics create` gives each role, the data topic's retention its layout 0's.
    assert created[0].config == {"retention.ms": "86400000", "cleanup.policy": "delete"}
    assert created[1].config == created[2].config == COMPACT
    assert b.events[-1] == Layout(1, 8)  # the record comes last
    assert b.records[-1] == encode_layout(Layout(1, 8), 5)


def test_the_flags_override_the_replication_factor_and_retention() -> None:
    b = four()
    grow(b, 8, replication_factor=2, retention_ms=1000)
    data = b.events[0]
    assert isinstance(data, TopicSpec)
    assert (data.replication_factor, data.config["retention.ms"]) == (2, "1000")


def test_a_data_topic_without_a_reported_retention_gets_the_default() -> None:
    b = four()
    del b.configs["d"]["retention.ms"]
    grow(b, 8)
    data = b.events[0]
    assert isinstance(data, TopicSpec)
    assert data.config["retention.ms"] == str(topics.DEFAULT_RETENTION_MS)


def cut_all(b: Brokers, layout: int, partitions: int, but: int = 0) -> None:
    """What the nodes write once they cut the layout before `layout` (its `partitions`)."""
    for p in range(partitions - but):
        b.records.append(encode_cut(Cut(layout, p, 10, 1, "n"), 1, 1))


def test_the_newest_layout_is_current_and_a_re_run_is_a_no_op() -> None:
    b = four()
    grow(b, 8)
    assert grow(b, 8) == ("layout 1 has 8 partitions already (d.l1, o.l1, s.l1): "
                          "nothing to do")
    cut_all(b, 1, 4)
    assert grow(b, 16).startswith("layout 2: 16 partitions, from 8 in layout 1: d.l2 created")
    assert [x for x in b.layouts() if x] == [Layout(1, 8), Layout(2, 16)]
    assert b.counts["s.l2"] == 16


def test_a_growth_waits_until_the_nodes_entered_the_last_one() -> None:
    """Layout 1 announced but a partition of layout 0 not cut yet: another growth would leave
    that partition's queues behind."""
    b = four()
    grow(b, 8)
    cut_all(b, 1, 4, but=1)
    before = len(b.events)
    with pytest.raises(ConfigError, match="layout 1 is still being entered: 3 of the 4 "):
        grow(b, 16)
    assert len(b.events) == before and "d.l2" not in b.counts
    cut_all(b, 1, 4)
    assert grow(b, 16).startswith("layout 2: 16 partitions")


def test_the_newest_layout_ignores_claims_and_other_records_and_follows_tombstones() -> None:
    l1, l2 = encode_layout(Layout(1, 8), 1), encode_layout(Layout(2, 16), 2)
    assert topics.newest_layout([l2, (b"3", b"{}"), l1, (None, b"x")]) == Layout(2, 16)
    assert topics.newest_layout([l1, l2, (l2[0], None)]) == Layout(1, 8)
    assert topics.newest_layout([(b"layout/1", b"not json"), (b"1", None)]) is None


@pytest.mark.parametrize("partitions, says", [
    (12, "--partitions 12 is not a multiple of the current 8"),
    (4, "--partitions 4 is not above the current 8"),
])
def test_a_growth_the_layouts_do_not_allow_is_refused_with_its_reason(partitions: int,
                                                                       says: str) -> None:
    b = four()
    grow(b, 8)
    before = len(b.events)
    with pytest.raises(topics.GrowthRefused, match=says):
        grow(b, partitions)
    assert len(b.events) == before


def test_the_last_layout_grows_no_more() -> None:
    b = Brokers({"d": 1, "o": 1, "s": 1, "a": 1,
                 **{f"{t}.l{MAX_LAYOUT}": 2 for t in "dos"}})
    b.records.append(encode_layout(Layout(MAX_LAYOUT, 2), 1))
    with pytest.raises(topics.GrowthRefused, match=f"at most {MAX_LAYOUT} times"):
        grow(b, 4)


def test_the_current_layouts_topics_must_exist_with_its_partition_count() -> None:
    b = Brokers({"d": 4, "o": 4, "a": 1, "d.l1": 8, "o.l1": 4})
    b.records.append(encode_layout(Layout(1, 8), 1))
    with pytest.raises(ConfigError) as err:
        grow(b, 16)
    assert str(err.value) == ("layout 1 (8 partitions): topic 'o.l1' has 4 partitions, not 8; "
                              "topic 's.l1' does not exist")
    assert not b.events
    with pytest.raises(ConfigError, match="topic 's' does not exist"):
        grow(Brokers({"d": 4, "o": 4, "a": 1}), 8)
    with pytest.raises(ConfigError, match="topic 'd' does not exist"):
        grow(Brokers({"a": 1}), 8)
    with pytest.raises(ConfigError, match="assignment topic 'a' has 2 partitions"):
        grow(Brokers({"d": 4, "o": 4, "s": 4, "a": 2}), 8)


def test_growing_needs_the_snapshot_topic() -> None:
    b = four()
    with pytest.raises(ConfigError, match="needs the snapshot topic"):
        topics.grow(b, b, Settings(data_topic="d", offset_topic="o", assignment_topic="a",
                                   snapshot_topic=""), 8)


def test_topics_left_by_a_run_that_stopped_before_the_record_are_reused() -> None:
    b = four()
    b.counts["o.l1"] = 8
    b.configs["o.l1"] = {**COMPACT, "segment.ms": "1"}
    line = grow(b, 8)
    assert ("d.l1 created, o.l1 reused, set segment.ms=3600000 (was 1), s.l1 created"
            in line)
    assert b.layouts()[-1] == Layout(1, 8)


def test_topics_of_the_next_layout_with_another_count_are_refused_and_nothing_is_made(
        ) -> None:
    b = four()
    b.counts["s.l1"] = 16
    b.configs["s.l1"] = dict(COMPACT)
    with pytest.raises(ConfigError) as err:
        grow(b, 8)
    assert "topic 's.l1' exists with 16 partitions, not 8" in str(err.value)
    assert not b.events


def test_no_record_is_written_until_the_brokers_list_the_new_topics() -> None:
    b = Brokers({"d": 4, "o": 4, "s": 4, "a": 1}, listed=False)
    with pytest.raises(ConfigError, match=r"topic 'd\.l1' does not exist.*after waiting 0\.05 s"):
        grow(b, 8)
    assert b.records == []


def test_a_dry_run_says_what_it_would_do_and_changes_nothing() -> None:
    b = four()
    b.counts["d.l1"] = 8
    line = grow(b, 8, dry_run=True)
    assert line == ("dry run: layout 1: 8 partitions, from 4 in layout 0: would create d.l1, "
                    "o.l1, s.l1 (reusing d.l1) (replication factor 3, retention.ms 86400000) "
                    "and write layout/1 to a; nothing changed")
    assert not b.events and len(b.records) == 1


def test_grow_takes_the_flags_of_topics_create() -> None:
    shared = ["--bootstrap", "k:9092", "--replication-factor", "3", "--retention-ms", "5",
              "--data-topic", "d", "--offset-topic", "o", "--assignment-topic", "a",
              "--snapshot-topic", "s", "--compacted-segment-ms", "60000",
              "--kafka-options", "security.protocol=SSL"]
    parser = build_parser()
    created = vars(parser.parse_args(["topics", "create", *shared]))
    grown = vars(parser.parse_args(["topics", "grow", "--partitions", "8", *shared]))
    assert {k: v for k, v in grown.items() if k not in ("topics_command", "dry_run")} == {
        k: v for k, v in created.items() if k != "topics_command"} | {"partitions": 8}
    bare = parser.parse_args(["topics", "grow", "--partitions", "8"])
    assert (bare.replication_factor, bare.retention_ms, bare.dry_run) == (None, None, False)
    with pytest.raises(SystemExit):
        parser.parse_args(["topics", "grow"])  # --partitions is required


@pytest.mark.parametrize("error, status", [
    (topics.GrowthRefused("--partitions 12 is not a multiple of the current 8"), 2),
    (ConfigError("layout 0 (4 partitions): topic 's' does not exist"), 3),
    (BrokerError("broker_unreachable", "Kafka (listing topics): all brokers down"), 1),
])
def test_the_command_says_why_on_stderr_with_its_exit_status(
        error: Exception, status: int, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(*args: object, **kw: object) -> str:
        raise error

    monkeypatch.setattr(logs, "setup", lambda *a: None)
    monkeypatch.setattr(admin, "Admin", lambda conf: None)  # no broker in the unit tier
    monkeypatch.setattr(topics, "grow", refuse)
    assert cli.main(["topics", "grow", "--partitions", "12", "--bootstrap", "127.0.0.1:1"]) \
        == status
    out = capsys.readouterr()
    assert out.out == "" and out.err == f"vqueues topics grow: {error}\n"
