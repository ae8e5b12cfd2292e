"""The topics vqueues uses, how they are created, and the check a node runs at start."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from vqueues.errors import ConfigError
from vqueues.kafka.admin import Admin, TopicSpec

DEFAULT_PARTITIONS = 16
DEFAULT_RETENTION_MS = 14 * 24 * 3600 * 1000
# How long `vqueues topics create` waits for every broker it asks to list the topics it just
# created: on a cluster, a broker learns a new topic some time after the controller made it.
CREATE_WAIT_S = 30.0


class TopicAdmin(Protocol):
    """What these functions need of `vqueues.kafka.admin.Admin` (a seam for unit tests)."""

    def partition_counts(self, topics: Sequence[str], timeout_s: float = ...
                         ) -> dict[str, int | None]: ...


def specs(data_topic: str, offset_topic: str, assignment_topic: str,
          partitions: int = DEFAULT_PARTITIONS, retention_ms: int = DEFAULT_RETENTION_MS,
          replication_factor: int = -1, snapshot_topic: str = "") -> list[TopicSpec]:
    """Data (retention-bound), offsets and snapshots (compacted, same partition count),
    assignments (1 partition)."""
    out = [
        TopicSpec(data_topic, partitions, replication_factor,
                  {"retention.ms": str(retention_ms), "cleanup.policy": "delete"}),
        TopicSpec(offset_topic, partitions, replication_factor, {"cleanup.policy": "compact"}),
        TopicSpec(assignment_topic, 1, replication_factor, {"cleanup.policy": "compact"}),
    ]
    if snapshot_topic:
        out.append(TopicSpec(snapshot_topic, partitions, replication_factor,
                             {"cleanup.policy": "compact"}))
    return out


def create(admin: Admin, topic_specs: list[TopicSpec]) -> dict[str, str]:
    return admin.create(topic_specs)


def _counts(admin: TopicAdmin, names: list[str], wait_s: float, interval_s: float
            ) -> dict[str, int | None]:
    """Partition counts; while a topic is missing, asked again until `wait_s` has passed."""
    deadline = time.monotonic() + wait_s
    while True:
        counts = admin.partition_counts(names)
        if all(n is not None for n in counts.values()) or time.monotonic() >= deadline:
            return counts
        time.sleep(interval_s)


def _waited(wait_s: float) -> str:
    return f" (not in the brokers' metadata after waiting {wait_s:g} s)" if wait_s else ""


def check(admin: TopicAdmin, data_topic: str, offset_topic: str, assignment_topic: str,
          wait_s: float = 0.0, interval_s: float = 0.2) -> int:
    """Return the data topic's partition count, or raise ConfigError naming every problem.
    `wait_s`: how long a missing topic is looked for again (a broker that has not learned a
    topic just created lists it a little later)."""
    counts = _counts(admin, [data_topic, offset_topic, assignment_topic], wait_s, interval_s)
    problems = []
    for name, n in counts.items():
        if n is None:
            problems.append(f"topic {name!r} does not exist")
    if problems:
        problems[-1] += _waited(wait_s)
    d, o, a = counts[data_topic], counts[offset_topic], counts[assignment_topic]
    if d is not None and o is not None and d != o:
        problems.append(f"data topic {data_topic!r} has {d} partitions but offset topic "
                        f"{offset_topic!r} has {o}; they must be equal")
    if a is not None and a != 1:
        problems.append(f"assignment topic {assignment_topic!r} has {a} partitions; it must have 1")
    if problems:
        found = ", ".join(f"{k}={v if v is not None else 'missing'}" for k, v in counts.items())
        raise ConfigError("; ".join(problems) + f" (partition counts: {found}). "
                          "Create them with `vqueues topics create`.")
    assert d is not None
    return d


def check_snapshots(admin: TopicAdmin, snapshot_topic: str, partitions: int,
                    wait_s: float = 0.0, interval_s: float = 0.2) -> bool:
    """Whether the snapshot topic exists (False: the node runs without snapshots); ConfigError
    if its partition count differs from the data topic's. `wait_s` as for `check`."""
    if not snapshot_topic:
        return False
    n = _counts(admin, [snapshot_topic], wait_s, interval_s)[snapshot_topic]
    if n is None:
        return False
    if n != partitions:
        raise ConfigError(f"snapshot topic {snapshot_topic!r} has {n} partitions; the data "
                          f"topic has {partitions}; they must be equal")
    return True
