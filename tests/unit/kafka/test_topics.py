"""`vqueues.kafka.topics`: the check's wait for topics the brokers have not listed yet, the
compacted topics' config, and bringing an existing topic's config in line, through a fake admin."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from vqueues.errors import ConfigError
from vqueues.kafka import topics
from vqueues.kafka.admin import TopicSpec
from vqueues.settings import Settings

NAMES = ("d", "o", "a")


class LaggingAdmin:
    """Lists the topics only from its `late`-th metadata answer on (a broker that has not
    learned them yet answers "no such topic" before)."""

    def __init__(self, late: int, counts: Mapping[str, int]) -> None:
        self.late = late
        self.counts = dict(counts)
        self.asked = 0

    def partition_counts(self, names: Sequence[str], timeout_s: float = 10.0
                         ) -> dict[str, int | None]:
        self.asked += 1
        known = self.asked > self.late
        return {n: self.counts.get(n) if known else None for n in names}


def test_check_waits_for_topics_the_brokers_list_late() -> None:
    admin = LaggingAdmin(3, {"d": 4, "o": 4, "a": 1, "s": 4})
    assert topics.check(admin, *NAMES, wait_s=5, interval_s=0.01) == 4
    assert admin.asked == 4
    assert topics.check_snapshots(LaggingAdmin(2, admin.counts), "s", 4, wait_s=5,
                                  interval_s=0.01)


def test_without_a_wait_the_check_answers_from_the_first_listing() -> None:
    with pytest.raises(ConfigError, match="topic 'd' does not exist"):
        topics.check(LaggingAdmin(1, {"d": 4, "o": 4, "a": 1}), *NAMES)
    assert not topics.check_snapshots(LaggingAdmin(1, {"s": 4}), "s", 4)


def test_a_topic_that_never_appears_is_named_with_the_wait() -> None:
    admin = LaggingAdmin(0, {"d": 4, "a": 1})
    with pytest.raises(ConfigError) as err:
        topics.check(admin, *NAMES, wait_s=0.05, interval_s=0.01)
    assert "topic 'o' does not exist (not in the brokers' metadata after waiting 0.05 s)" \
        in str(err.value)
    assert admin.asked >= 2  # looked again before giving up


def test_a_partition_mismatch_is_not_waited_for() -> None:
    admin = LaggingAdmin(0, {"d": 4, "o": 8, "a": 1})
    with pytest.raises(ConfigError, match="has 8"):
        topics.check(admin, *NAMES, wait_s=30, interval_s=0.01)
    assert admin.asked == 1


def test_the_compacted_topics_get_the_segment_and_tombstone_settings() -> None:
    specs = topics.specs("d", "o", "a", 4, snapshot_topic="s")
    want = {"cleanup.policy": "compact", "segment.bytes": str(100 * 1024 * 1024),
            "segment.ms": "3600000", "delete.retention.ms": "3600000"}
    assert {s.name: s.config for s in specs if s.name != "d"} == {"o": want, "a": want,
                                                                   "s": want}
    assert specs[0].config == {"retention.ms": str(topics.DEFAULT_RETENTION_MS),
                               "cleanup.policy": "delete"}
    mine = topics.compaction_config(Settings.load(env={"VQ_COMPACTED_SEGMENT_MS": "60000"}))
    assert mine["segment.ms"] == "60000"


def test_compacted_segment_bytes_below_kafkas_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1048576"):
        Settings.load(env={"VQ_COMPACTED_SEGMENT_BYTES": "1000"})


class ConfigFake:
    """Topics that exist with a config; records what was set."""

    def __init__(self, configs: dict[str, dict[str, str]]) -> None:
        self.configs = configs
        self.set: list[tuple[str, dict[str, str]]] = []

    def create(self, specs: Sequence[TopicSpec], timeout_s: float = 30.0) -> dict[str, str]:
        out = {}
        for s in specs:
            out[s.name] = "exists" if s.name in self.configs else "created"
            self.configs.setdefault(s.name, dict(s.config))
        return out

    def topic_configs(self, names: Sequence[str], keys: Sequence[str], timeout_s: float = 10.0
                      ) -> dict[str, dict[str, str]]:
        return {n: {k: v for k, v in self.configs[n].items() if k in keys} for n in names}

    def set_topic_configs(self, topic: str, config: Mapping[str, str],
                          timeout_s: float = 30.0) -> None:
        self.set.append((topic, dict(config)))
        self.configs[topic].update(config)

    def partition_counts(self, names: Sequence[str], timeout_s: float = 10.0
                         ) -> dict[str, int | None]:
        return {n: 1 for n in names}


def test_an_existing_compacted_topic_is_brought_in_line_once_and_the_data_topic_is_not() -> None:
    old = {"cleanup.policy": "compact", "segment.bytes": "1073741824",
           "segment.ms": "604800000", "delete.retention.ms": "86400000"}
    admin = ConfigFake({"d": {"retention.ms": "1"}, "o": dict(old),
                        "a": {**old, "segment.ms": "3600000"}})
    outcome = topics.create(admin, topics.specs("d", "o", "a", 4, snapshot_topic="s"))
    assert outcome == {
        "d": "exists", "s": "created",
        "o": "exists; set segment.bytes=104857600 (was 1073741824), segment.ms=3600000 (was "
             "604800000), delete.retention.ms=3600000 (was 86400000)",
        "a": "exists; set segment.bytes=104857600 (was 1073741824), delete.retention.ms=3600000 "
             "(was 86400000)"}
    assert admin.configs["d"] == {"retention.ms": "1"}
    again = topics.create(admin, topics.specs("d", "o", "a", 4, snapshot_topic="s"))
    assert again == dict.fromkeys("doas", "exists")
    assert len(admin.set) == 2
