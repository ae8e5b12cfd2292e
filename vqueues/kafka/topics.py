"""The topics vqueues uses, how they are created, and the check a node runs at start."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Protocol

from vqueues.errors import ConfigError
from vqueues.kafka.admin import TopicSpec
from vqueues.settings import Settings

DEFAULT_PARTITIONS = 16
DEFAULT_RETENTION_MS = 14 * 24 * 3600 * 1000
# How long `vqueues topics create` waits for every broker it asks to list the topics it just
# created: on a cluster, a broker learns a new topic some time after the controller made it.
CREATE_WAIT_S = 30.0
# The compacted topics' settings that `Settings` chooses, and so `topics create` keeps in line.
COMPACTION_KEYS = ("segment.bytes", "segment.ms", "delete.retention.ms")


class TopicAdmin(Protocol):
    """What these functions need of `vqueues.kafka.admin.Admin` (a seam for unit tests)."""

    def partition_counts(self, topics: Sequence[str], timeout_s: float = ...
                         ) -> dict[str, int | None]: ...


class ConfigAdmin(TopicAdmin, Protocol):
    def topic_configs(self, topics: Sequence[str], keys: Sequence[str], timeout_s: float = ...
                      ) -> dict[str, dict[str, str]]: ...

    def set_topic_configs(self, topic: str, config: Mapping[str, str],
                          timeout_s: float = ...) -> None: ...

    def create(self, specs: Sequence[TopicSpec], timeout_s: float = ...) -> dict[str, str]: ...


def compaction_config(settings: Settings | None = None) -> dict[str, str]:
    """The offset, snapshot and assignment topics' config: compacted, with the segment and
    tombstone settings of `settings` (docs/kafka.md says why)."""
    s = settings or Settings()
    return {"cleanup.policy": "compact",
            "segment.bytes": str(s.compacted_segment_bytes),
            "segment.ms": str(s.compacted_segment_ms),
            "delete.retention.ms": str(s.compacted_delete_retention_ms)}


def specs(data_topic: str, offset_topic: str, assignment_topic: str,
          partitions: int = DEFAULT_PARTITIONS, retention_ms: int = DEFAULT_RETENTION_MS,
          replication_factor: int = -1, snapshot_topic: str = "",
          compaction: Mapping[str, str] | None = None) -> list[TopicSpec]:
    """Data (retention-bound), offsets and snapshots (compacted, same partition count),
    assignments (1 partition). `compaction`: the compacted topics' config (default:
    `compaction_config()` of the default settings)."""
    compacted = dict(compaction or compaction_config())
    out = [
        TopicSpec(data_topic, partitions, replication_factor,
                  {"retention.ms": str(retention_ms), "cleanup.policy": "delete"}),
        TopicSpec(offset_topic, partitions, replication_factor, dict(compacted)),
        TopicSpec(assignment_topic, 1, replication_factor, dict(compacted)),
    ]
    if snapshot_topic:
        out.append(TopicSpec(snapshot_topic, partitions, replication_factor, dict(compacted)))
    return out


def create(admin: ConfigAdmin, topic_specs: list[TopicSpec]) -> dict[str, str]:
    """Create the topics; name -> "created", "exists", or for an existing compacted topic whose
    `COMPACTION_KEYS` differed from its spec, "exists; set key=value (was old), ..." after
    setting them (idempotent: a second run changes nothing)."""
    outcome = admin.create(topic_specs)
    existing = {s.name: s for s in topic_specs if outcome.get(s.name) == "exists"
                and s.config.get("cleanup.policy") == "compact"}
    if not existing:
        return outcome
    current = admin.topic_configs(list(existing), COMPACTION_KEYS)
    for name, spec in existing.items():
        have = current.get(name, {})
        change = {k: spec.config[k] for k in COMPACTION_KEYS
                  if k in spec.config and have.get(k) != spec.config[k]}
        if change:
            admin.set_topic_configs(name, change)
            outcome[name] = "exists; set " + ", ".join(
                f"{k}={v} (was {have.get(k, 'unset')})" for k, v in change.items())
    return outcome


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
