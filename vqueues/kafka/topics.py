"""The topics vqueues uses, how they are created, the check a node runs at start, and growing
them by a new layout (ADR 19)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from vqueues.errors import ConfigError
from vqueues.kafka.admin import TopicSpec
from vqueues.layouts import (
    LAYOUT_KEY_PREFIX,
    Layout,
    check_growth,
    decode_cut,
    decode_layout,
    encode_layout,
)
from vqueues.settings import Settings

log = logging.getLogger(__name__)

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


class GrowAdmin(ConfigAdmin, Protocol):
    def replication_factors(self, topics: Sequence[str], timeout_s: float = ...
                            ) -> dict[str, int | None]: ...


class RecordLog(Protocol):
    """The assignment topic as `grow` reads and writes it (`vqueues.kafka.logs.RecordTopic`)."""

    def read(self) -> list[tuple[bytes | None, bytes | None]]: ...

    def append(self, key: bytes, value: bytes) -> None: ...


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


def _counts(admin: TopicAdmin, names: list[str], wait_s: float, interval_s: float,
            stopped: threading.Event | None = None) -> dict[str, int | None]:
    """Partition counts; while a topic is missing, asked again until `wait_s` has passed
    (or `stopped` is set: the process was asked to stop meanwhile)."""
    deadline = time.monotonic() + wait_s
    said = False
    while True:
        counts = admin.partition_counts(names)
        if all(n is not None for n in counts.values()) or time.monotonic() >= deadline:
            return counts
        if not said:  # why a command or a node has not gone on yet
            log.info("topics_waiting", extra={
                "missing": [n for n, c in counts.items() if c is None], "wait_s": wait_s})
            said = True
        if stopped is not None and stopped.wait(interval_s):
            return counts
        if stopped is None:
            time.sleep(interval_s)


def _waited(wait_s: float) -> str:
    return f" (not in the brokers' metadata after waiting {wait_s:g} s)" if wait_s else ""


def check(admin: TopicAdmin, data_topic: str, offset_topic: str, assignment_topic: str,
          wait_s: float = 0.0, interval_s: float = 0.2,
          stopped: threading.Event | None = None) -> int:
    """Return the data topic's partition count, or raise ConfigError naming every problem.
    `wait_s`: how long a missing topic is looked for again (a broker that has not learned a
    topic just created lists it a little later)."""
    counts = _counts(admin, [data_topic, offset_topic, assignment_topic], wait_s, interval_s,
                     stopped)
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


class GrowthRefused(ValueError):
    """`vqueues topics grow --partitions M` is not a growth the layouts allow (exit status 2)."""


def newest_layout(records: Iterable[tuple[bytes | None, bytes | None]]) -> Layout | None:
    """The highest-numbered layout the assignment topic's records announce (a tombstone takes
    its layout's record back), or None: the cluster is on layout 0."""
    layouts: dict[bytes, Layout] = {}
    for key, value in records:
        layout = decode_layout(key, value)
        if layout is not None and key is not None:
            layouts[key] = layout
        elif key is not None and value is None and key.startswith(LAYOUT_KEY_PREFIX):
            layouts.pop(key, None)
    return max(layouts.values(), key=lambda lay: lay.number, default=None)


def _layout_topics(settings: Settings, layout: Layout) -> tuple[str, str, str]:
    return layout.topics(settings.data_topic, settings.offset_topic, settings.snapshot_topic)


def _check_layout(admin: TopicAdmin, layout: Layout, names: Sequence[str], wait_s: float = 0.0,
                  interval_s: float = 0.2) -> None:
    """ConfigError naming each of `names` that is missing or has not `layout.partitions`."""
    counts = _counts(admin, list(names), wait_s, interval_s)
    problems = [f"topic {name!r} does not exist" if n is None else
                f"topic {name!r} has {n} partitions, not {layout.partitions}"
                for name, n in counts.items() if n != layout.partitions]
    if problems:
        raise ConfigError(f"layout {layout.number} ({layout.partitions} partitions): "
                          + "; ".join(problems) + _waited(wait_s))


def current_layout(admin: TopicAdmin, log: RecordLog, settings: Settings) -> Layout:
    """The newest layout the assignment topic announces (layout 0, the data topic's partition
    count, if none), once its three topics are checked; ConfigError names every problem."""
    if not settings.snapshot_topic:
        raise ConfigError("growing needs the snapshot topic (a partition hands its queues to "
                          "the next layout in a final snapshot), and snapshot_topic is empty")
    name = settings.assignment_topic
    a = admin.partition_counts([name])[name]
    if a != 1:
        raise ConfigError(f"assignment topic {name!r} " + (
            "does not exist" if a is None else f"has {a} partitions; it must have 1")
            + ". Create the topics with `vqueues topics create`.")
    current = newest_layout(log.read())
    if current is None:
        data = settings.data_topic
        n = admin.partition_counts([data])[data]
        if n is None:
            raise ConfigError(f"topic {data!r} does not exist. Create the topics with "
                              "`vqueues topics create`.")
        current = Layout(0, n)
    _check_layout(admin, current, _layout_topics(settings, current))
    return current


def growth_under_way(admin: TopicAdmin, records: Iterable[tuple[bytes | None, bytes | None]],
                     settings: Settings, current: Layout) -> str | None:
    """Why another growth must wait: the nodes have not cut every partition of the layout
    before `current` yet (a layout announced twice in a row would leave the queues of the
    first behind); None once they have, or on layout 0."""
    if current.number == 0:
        return None
    before: Layout | None = None
    cut: set[int] = set()
    for key, value in records:
        layout, found = decode_layout(key, value), decode_cut(key, value)
        if layout is not None and layout.number == current.number - 1:
            before = layout
        if found is not None and found.layout == current.number:
            cut.add(found.partition)
    if before is None:
        data = settings.data_topic
        before = Layout(0, admin.partition_counts([data])[data] or 0)
    if len(cut) >= before.partitions:
        return None
    return (f"layout {current.number} is still being entered: {len(cut)} of the "
            f"{before.partitions} partitions of layout {before.number} are cut; grow again "
            "once the nodes serve it (GET /v1/partitions says its layout)")


def grow(admin: GrowAdmin, log: RecordLog, settings: Settings, partitions: int, *,
         replication_factor: int | None = None, retention_ms: int | None = None,
         dry_run: bool = False, now_ms: int = 0, wait_s: float = CREATE_WAIT_S,
         interval_s: float = 0.2) -> str:
    """Grow the cluster to `partitions` by a new layout: create its three topics (or reuse
    them, left by a run that stopped before its record), wait until the brokers list them,
    then write its record to the assignment topic. Returns the line that says what was done.

    `replication_factor` and `retention_ms` default to the current data topic's. Raises
    GrowthRefused if `check_growth` refuses, ConfigError if the current layout's topics or the
    next one's do not match."""
    current = current_layout(admin, log, settings)
    if partitions == current.partitions:
        return (f"layout {current.number} has {partitions} partitions already "
                f"({', '.join(_layout_topics(settings, current))}): nothing to do")
    refusal = check_growth(current, partitions)
    if refusal:
        raise GrowthRefused(refusal)
    entering = growth_under_way(admin, log.read(), settings, current)
    if entering:
        raise ConfigError(entering)
    target = Layout(current.number + 1, partitions)
    names = _layout_topics(settings, target)
    existing = {n: c for n, c in admin.partition_counts(names).items() if c is not None}
    wrong = {n: c for n, c in existing.items() if c != partitions}
    if wrong:
        raise ConfigError(
            "; ".join(f"topic {n!r} exists with {c} partitions, not {partitions}"
                      for n, c in wrong.items())
            + f" (left by an earlier `vqueues topics grow` that stopped before it wrote layout "
            f"{target.number}'s record?): grow to that count, or delete these topics first")
    old_data = _layout_topics(settings, current)[0]
    if retention_ms is None:
        have = admin.topic_configs([old_data], ["retention.ms"]).get(old_data, {})
        retention_ms = int(have.get("retention.ms", DEFAULT_RETENTION_MS))
    if replication_factor is None:
        replication_factor = admin.replication_factors([old_data])[old_data] or -1
    new_specs = [s for s in specs(names[0], names[1], settings.assignment_topic, partitions,
                                  retention_ms, replication_factor, names[2],
                                  compaction_config(settings))
                 if s.name != settings.assignment_topic]
    key = LAYOUT_KEY_PREFIX.decode() + str(target.number)
    what = (f"layout {target.number}: {partitions} partitions, from {current.partitions} in "
            f"layout {current.number}")
    if dry_run:
        reuse = f" (reusing {', '.join(existing)})" if existing else ""
        return (f"dry run: {what}: would create {', '.join(names)}{reuse} (replication factor "
                f"{replication_factor}, retention.ms {retention_ms}) and write {key} to "
                f"{settings.assignment_topic}; nothing changed")
    outcome = create(admin, new_specs)
    _check_layout(admin, target, names, wait_s, interval_s)
    log.append(*encode_layout(target, now_ms))
    done = ", ".join(f"{n} " + ("created" if outcome[n] == "created" else
                                "reused" + outcome[n].removeprefix("exists").replace(";", ","))
                     for n in names)
    return f"{what}: {done}; wrote {key} to {settings.assignment_topic}"
