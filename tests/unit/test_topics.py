"""`vqueues.topics`: the check's wait for topics the brokers have not listed yet, through a
fake admin."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from vqueues import topics
from vqueues.errors import ConfigError

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

