"""A Spark Structured Streaming source for Kafka topics, with PySpark's Python Data Source API.

Registered as `vqueues-kafka`. Columns are those of Spark's own Kafka source (`key, value, topic,
partition, offset, timestamp, timestampType, headers`) plus `queue`, the key as a string. Options
use Spark's Kafka source names, so switching to `format("kafka")` is a one-word change:

  kafka.bootstrap.servers   required
  subscribe                 the topic (one)
  subscribePattern          or every topic whose whole name matches this regular expression,
                            checked again at each micro-batch: a topic that appears later is
                            read from its earliest offset (as Spark's source does)
  startingOffsets           earliest (default) | latest | {"topic": {"0": 42, "1": -2}}
                            (-2: earliest, -1: latest)
  maxOffsetsPerTrigger      most records per micro-batch (default: all available)
  endingOffsets             (batch reads, spark.read) latest (default) | {"topic": {"0": n}}
  failOnDataLoss            true (default): fail when a start offset is below the partition's
                            first retained offset (retention deleted records); false: go on
                            from the first retained offset
  minPartitions             at least this many Spark tasks per batch (ranges are split)
  queues                    a JSON list of queue names: only their records, and only the
                            Kafka partitions they route to are read (pushed down to the readers),
                            in each layout's data topic (ADR 19) the partition they route to there
  skipDeletedQueues         true: drop records hidden by a queue deletion (the deletion markers
                            in the offset topics, option deletionTopic, default vq-offsets)
  assignmentTopic           where the layouts' partition counts are read (default vq-assignments),
                            when queues or skipDeletedQueues needs them
  queueBuckets              N: add a column `bucket int`, the archive bucket of the record's
                            queue (mmh3, vqueues/pipeline/layout.py), computed in the reader
  kafka.*                   passed to the Kafka client (security.protocol, sasl.*, ssl.*, ...)

Offsets are {"<topic>": {"<partition>": next offset}}, as Spark's source writes them; a
checkpoint written before layouts holds {"<partition>": next offset} of its one topic, read as
the offsets of the (layout 0) topic subscribed or matched. End offsets are found by consuming to
EOF, so they are right on Kafka and on the embedded broker alike.

Options of Spark's Kafka source that would change which records are read, and that this source
cannot honour, are refused by name (`REFUSED`) rather than ignored; options that only tune
Spark's own consumer are accepted and have no effect (`IGNORED`). docs/pipeline.md has the table,
checked against Spark's connector by tests/test_pipeline.py.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from vqueues.layouts import layout_of_topic, tag, topic_name

log = logging.getLogger(__name__)

SOURCE_NAME = "vqueues-kafka"
SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int, "
          "headers array<struct<key: string, value: binary>>, queue string")
# Spark's Kafka source options this source refuses (lower case, as Spark passes them): why.
REFUSED = {
    "assign": "use subscribe with startingOffsets/endingOffsets per partition",
    "startingtimestamp": "start by offset (startingOffsets)",
    "startingoffsetsbytimestamp": "start by offset (startingOffsets)",
    "startingoffsetsbytimestampstrategy": "start by offset (startingOffsets)",
    "endingtimestamp": "end by offset (endingOffsets)",
    "endingoffsetsbytimestamp": "end by offset (endingOffsets)",
    "minoffsetspertrigger": "a micro-batch takes what is available, up to maxOffsetsPerTrigger",
    "maxtriggerdelay": "a micro-batch takes what is available, up to maxOffsetsPerTrigger",
    "maxrecordsperpartition": "tasks are split at 250,000 records; use minPartitions",
}
# Accepted with no effect: they tune Spark's own consumer (librdkafka retries by itself), or
# name a group nothing is committed to (offsets live in the checkpoint).
IGNORED = {"fetchoffset.numretries", "fetchoffset.retryintervalms", "kafkaconsumer.polltimeoutms",
           "groupidprefix", "kafka.group.id", "includeheaders"}
# A Spark task reads at most this many records; larger ranges are split.
MAX_RECORDS_PER_TASK = 250_000

# {"<topic>": {"<partition>": offset}}, the JSON of Spark's Kafka source.
Offsets = dict[str, dict[str, int]]


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int
    # The partition count the topic's queues route over, and (only when deletion markers are
    # read) the partition counts of the later layouts, (layout, partitions) in order.
    route: int = 0
    later: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class Reading:
    """How ranges are planned and read (options shared by streaming and batch reads)."""

    fail_on_data_loss: bool = True
    min_partitions: int = 0
    queues: tuple[str, ...] | None = None  # only these queues' records (and partitions)
    deletion_topic: str | None = None  # skip records hidden by deletion markers there
    assignment_topic: str = "vq-assignments"  # the layouts' partition counts

    @property
    def needs_layouts(self) -> bool:
        """Whether planning needs each layout's partition count."""
        return self.queues is not None or self.deletion_topic is not None


@dataclass(frozen=True)
class Subscription:
    """The topics read: one (`subscribe`) or every one whose whole name matches `pattern`."""

    topic: str = ""
    pattern: str = ""

    def matches(self, name: str) -> bool:
        if self.topic:
            return name == self.topic
        return re.fullmatch(self.pattern, name) is not None

    def __str__(self) -> str:
        return f"subscribe {self.topic}" if self.topic else f"subscribePattern {self.pattern}"


def _offsets_option(raw: str, sub: Subscription, name: str) -> str | Offsets:
    if raw in ("earliest", "latest"):
        return raw
    example = f'{{"{sub.topic or "<topic>"}": {{"0": offset, ...}}}}'
    try:
        spec = {str(t): {str(p): int(o) for p, o in parts.items()}
                for t, parts in json.loads(raw).items()}
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{SOURCE_NAME}: {name} must be earliest, latest or {example}") from None
    if sub.topic and sub.topic not in spec:
        raise ValueError(f"{SOURCE_NAME}: {name} must be earliest, latest or {example}")
    if stray := sorted(t for t in spec if not sub.matches(t)):
        raise ValueError(f"{SOURCE_NAME}: {name} names topic {stray[0]}, which {sub} does "
                         "not read")
    return spec


def resolve(spec: str | Offsets, earliest: Offsets, ends: Offsets, default: Offsets
            ) -> Offsets:
    """startingOffsets or endingOffsets for the partitions in `ends`: -2 is the earliest
    offset, -1 the end; a partition the spec leaves out takes `default`'s offset."""
    if spec == "earliest":
        return {t: dict(parts) for t, parts in earliest.items()}
    if spec == "latest":
        return {t: dict(parts) for t, parts in ends.items()}
    assert isinstance(spec, dict)
    out: Offsets = {}
    for t, parts in ends.items():
        given = spec.get(t, {})
        out[t] = {}
        for p in parts:
            o = given.get(p, -3)
            out[t][p] = (earliest[t][p] if o == -2 else ends[t][p] if o == -1
                         else default[t][p] if o == -3 else o)
    return out


def from_checkpoint(offsets: dict[str, Any], legacy_topic: Callable[[], str]) -> Offsets:
    """Offsets as Spark hands them back. A checkpoint written before this source read more than
    one topic holds {"<partition>": offset} of its one topic: they are the offsets of
    `legacy_topic()`, the (layout 0) topic read then."""
    if offsets and all(isinstance(v, int) for v in offsets.values()):
        return {legacy_topic(): {str(p): int(o) for p, o in offsets.items()}}
    if not all(isinstance(v, dict) for v in offsets.values()):
        raise ValueError(f"{SOURCE_NAME}: offsets {json.dumps(offsets)[:200]} are not "
                         '{"<topic>": {"<partition>": offset}}')
    return {str(t): {str(p): int(o) for p, o in parts.items()} for t, parts in offsets.items()}


def unread_when_gone(start: Offsets, ends: Offsets, seen: Offsets) -> Offsets:
    """Of the topics in `start` no longer in `ends` (deleted, such as a retired layout's), the
    partitions not known to have been read to their end: `seen` holds the ends this reader last
    saw (nothing after a restart)."""
    out: Offsets = {}
    for t, parts in start.items():
        if t in ends:
            continue
        last = seen.get(t, {})
        unread = {p: o for p, o in parts.items() if p not in last or o < last[p]}
        if unread:
            out[t] = unread
    return out


def deletion_partitions(layout: int, partition: int, route: int,
                        later: tuple[tuple[int, int], ...]) -> dict[int, list[int]]:
    """Layout -> the partitions of its offset topic that hold the deletion markers of the queues
    of `partition` in `layout` (whose queues route over `route` partitions): that partition of
    the layout's own offset topic and, in each later layout, the partitions those queues moved
    to, where a deletion after a growth is written. Markers of earlier layouts hide offsets
    below this layout's, so none of its records."""
    out = {layout: [partition]}
    for m, count in later:
        out[m] = [partition + j * route for j in range(count // route)]
    return out


def plan(start: Offsets, end: Offsets, earliest: Offsets, reading: Reading,
         routes: dict[str, int], layouts: dict[int, int] | None = None) -> list[KafkaRange]:
    """The ranges to read: per partition [start, end), without the partitions the queue filter
    rules out (each topic's queues route over `routes[topic]` partitions), from the first
    retained offset when retention passed the start (or an error with failOnDataLoss), split so
    that there are at least minPartitions ranges. `layouts`: the partition count of every layout
    known, for the deletion markers."""
    from vqueues.hashing import partition_for

    ranges = []
    for topic in sorted(end):
        route = routes.get(topic, 0)
        wanted: set[int] | None = None
        if reading.queues is not None:
            wanted = {partition_for(q, route) for q in reading.queues}
        own = layout_of_topic(topic)
        later = tuple(sorted((m, n) for m, n in (layouts or {}).items() if m > own)
                      ) if reading.deletion_topic else ()
        for p, until in sorted(end[topic].items(), key=lambda kv: int(kv[0])):
            if wanted is not None and int(p) not in wanted:
                continue
            first = earliest.get(topic, {}).get(p, 0)
            # A partition `start` lacks appeared since: it begins at its earliest offset.
            frm = start.get(topic, {}).get(p, first)
            if frm < first:
                if reading.fail_on_data_loss:
                    raise RuntimeError(
                        f"{SOURCE_NAME}: {topic}[{p}] starts at {first} now; offsets "
                        f"{frm}-{first - 1} were deleted (retention) before they were read. "
                        "Set failOnDataLoss=false to go on from the first retained offset")
                frm = first
            while frm < until:
                nxt = min(until, frm + MAX_RECORDS_PER_TASK)
                ranges.append(KafkaRange(topic, int(p), frm, nxt, route, later))
                frm = nxt
    while ranges and len(ranges) < reading.min_partitions:
        big = max(ranges, key=lambda r: r.end - r.start)
        if big.end - big.start < 2:
            break
        mid = (big.start + big.end) // 2
        i = ranges.index(big)
        ranges[i:i + 1] = [replace(big, end=mid), replace(big, start=mid)]
    return ranges


def read_records(conf: dict[str, str], r: KafkaRange, buckets: int | None, reading: Reading
                 ) -> Iterator[Any]:
    """The Arrow record batches of one range, filtered as `reading` says."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from vqueues.kafka.ranges import read_range
    from vqueues.pipeline.arrow import to_record_batch, with_bucket

    keep = pa.array(list(reading.queues), pa.string()) if reading.queues is not None else None
    deleted = (_deletion_floors(conf, reading.deletion_topic, r)
               if reading.deletion_topic else None)
    layout = layout_of_topic(r.topic)
    for msgs in read_range(conf, r.topic, r.partition, r.start, r.end):
        batch = to_record_batch(msgs)
        if keep is not None:
            batch = batch.filter(pc.is_in(batch.column("queue"), value_set=keep))
        if deleted:
            queues = batch.column("queue").to_pylist()
            offsets = batch.column("offset").to_pylist()
            # Floors are vqueues offsets: a record's Kafka offset tagged with its layout.
            mask = [deleted.get(q, -1) <= tag(layout, o)
                    for q, o in zip(queues, offsets, strict=True)]
            batch = batch.filter(pa.array(mask, pa.bool_()))
        if batch.num_rows:
            yield with_bucket(batch, buckets) if buckets else batch


def _deletion_floors(conf: dict[str, str], base: str, r: KafkaRange) -> dict[str, int]:
    """queue -> deleted_before, from the deletion markers of the range's queues in the offset
    topic (`base`) of its layout and of every later one."""
    from vqueues.kafka.logs import read_to_end
    from vqueues.records import QueueDeleted, decode_offset_entry

    floors: dict[str, int] = {}
    layout = layout_of_topic(r.topic)
    where = deletion_partitions(layout, r.partition, r.route, r.later)
    for m, partitions in sorted(where.items()):
        read = read_to_end({**conf, "group.id": "vqueues-deletions"}, topic_name(base, m),
                           partitions)
        for entries, _ in read.values():
            for key, value, _ in entries:
                if key and key.startswith(b'["q"'):
                    e = decode_offset_entry(key, value)
                    if isinstance(e, QueueDeleted):
                        floors[e.queue] = max(floors.get(e.queue, 0), e.deleted_before)
    return floors


def _kafka_conf(options: dict[str, str]) -> dict[str, str]:
    conf = {k[len("kafka."):]: v for k, v in options.items() if k.startswith("kafka.")}
    if "bootstrap.servers" not in conf:
        raise ValueError(f"{SOURCE_NAME}: option kafka.bootstrap.servers is required")
    return conf


def _subscription(opts: dict[str, str]) -> Subscription:
    topic = opts.get("subscribe") or opts.get("topic") or ""
    pattern = opts.get("subscribepattern") or ""
    if topic and pattern:
        raise ValueError(f"{SOURCE_NAME}: give subscribe or subscribePattern, not both")
    if pattern:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{SOURCE_NAME}: subscribePattern is not a regular expression: "
                             f"{exc}") from None
        return Subscription(pattern=pattern)
    if not topic or "," in topic:
        raise ValueError(f"{SOURCE_NAME}: option subscribe must name exactly one topic (or "
                         "use subscribePattern)")
    return Subscription(topic=topic)


class VQueuesKafkaSource(DataSource):
    """`spark.readStream.format("vqueues-kafka").option(...).load()`."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        opts = {k.lower(): v for k, v in options.items()}  # Spark lower-cases keys
        if refused := sorted(opts.keys() & REFUSED.keys()):
            raise ValueError(f"{SOURCE_NAME}: option {refused[0]} is not supported: "
                             f"{REFUSED[refused[0]]} (docs/pipeline.md)")
        self.conf = _kafka_conf({k: v for k, v in opts.items() if k not in IGNORED})
        self.subscription = _subscription(opts)
        self.starting = _offsets_option(opts.get("startingoffsets", "earliest"),
                                        self.subscription, "startingOffsets")
        raw_max = opts.get("maxoffsetspertrigger")
        self.max_per_trigger = int(raw_max) if raw_max else None
        if self.max_per_trigger is not None and self.max_per_trigger < 1:
            raise ValueError(f"{SOURCE_NAME}: maxOffsetsPerTrigger must be at least 1")
        raw_buckets = opts.get("queuebuckets")
        self.buckets = int(raw_buckets) if raw_buckets else None
        if self.buckets is not None and self.buckets < 1:
            raise ValueError(f"{SOURCE_NAME}: queueBuckets must be at least 1")
        self.ending = _offsets_option(opts.get("endingoffsets", "latest"), self.subscription,
                                      "endingOffsets")
        self.fail_on_data_loss = opts.get("failondataloss", "true").lower() != "false"
        self.min_partitions = int(opts.get("minpartitions") or 0)
        raw_queues = opts.get("queues")
        self.queues: list[str] | None = None
        if raw_queues:
            try:
                self.queues = [str(q) for q in json.loads(raw_queues)]
            except (ValueError, TypeError):
                raise ValueError(f"{SOURCE_NAME}: queues must be a JSON list of names") from None
        self.skip_deleted = opts.get("skipdeletedqueues", "false").lower() == "true"
        self.deletion_topic = opts.get("deletiontopic", "vq-offsets")
        self.assignment_topic = opts.get("assignmenttopic", "vq-assignments")

    def schema(self) -> str:
        return SCHEMA + (", bucket int" if self.buckets else "")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return VQueuesKafkaStreamReader(self.conf, self.subscription, self.starting,
                                        self.max_per_trigger, self.buckets, self._reading())

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read (`spark.read`) from startingOffsets to endingOffsets."""
        return VQueuesKafkaBatchReader(self.conf, self.subscription, self.starting, self.ending,
                                       self.buckets, self._reading())

    def _reading(self) -> Reading:
        return Reading(self.fail_on_data_loss, self.min_partitions,
                       tuple(self.queues) if self.queues is not None else None,
                       self.deletion_topic if self.skip_deleted else None,
                       self.assignment_topic)


class Topics:
    """Driver-side: the subscribed topics, their offsets, and the layouts' partition counts.
    Its Kafka client is opened lazily and never pickled."""

    def __init__(self, conf: dict[str, str], sub: Subscription, reading: Reading) -> None:
        self.conf = conf
        self.sub = sub
        self.reading = reading
        self.client: Any = None
        self.layouts: dict[int, int] = {}  # layout -> partitions, from the assignment topic
        self._held: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "client": None}

    def _client(self) -> Any:
        if self.client is None:
            from vqueues.kafka.ranges import OffsetRanges

            self.client = OffsetRanges(self.conf)
        return self.client

    def matched(self) -> dict[str, list[int]]:
        """The subscribed topics that exist, with their partitions. When the reading routes
        queues or reads deletion markers, a later layout's topic whose layout record is not in
        the assignment topic yet is left out until it is (then read from its earliest offset)."""
        every = self._client().topics()
        topics = {t: ps for t, ps in every.items() if self.sub.matches(t)}
        if self.sub.topic and not topics:
            raise RuntimeError(f"{SOURCE_NAME}: topic {self.sub.topic!r} not found")
        if self.reading.needs_layouts:
            self._learn_layouts(topics, every)
            held = {t for t in topics if layout_of_topic(t) not in self.layouts
                    and layout_of_topic(t) != 0}
            for t in sorted(held - self._held):
                log.warning("vqueues-kafka: topic %s is not read until the assignment topic %s "
                            "holds its layout's record (its partition count)", t,
                            self.reading.assignment_topic)
            self._held = held
            topics = {t: ps for t, ps in topics.items() if t not in held}
        return topics

    def _learn_layouts(self, topics: dict[str, list[int]], every: dict[str, list[int]]) -> None:
        """Read the layout records again when a topic names a layout not known yet (a growth
        creates its topics before its layout record)."""
        named = {layout_of_topic(t) for t in topics}
        if self.reading.deletion_topic:
            base = self.reading.deletion_topic
            named |= {n for t in every if t == topic_name(base, n := layout_of_topic(t))}
        if not named - {0} - self.layouts.keys():
            return
        from vqueues.kafka.logs import read_to_end
        from vqueues.layouts import decode_layout

        topic = self.reading.assignment_topic
        if topic not in every:
            raise RuntimeError(
                f"{SOURCE_NAME}: the partition counts of layouts {sorted(named - {0})} are read "
                f"from the assignment topic {topic!r}, which does not exist: set the option "
                "assignmentTopic to the cluster's (settings: assignment_topic)")
        entries, _ = read_to_end({**self.conf, "group.id": "vqueues-layouts"}, topic, [0])[0]
        for key, value, _ in entries:
            layout = decode_layout(key, value)
            if layout is not None:
                self.layouts[layout.number] = layout.partitions

    def routes(self, topics: dict[str, list[int]]) -> dict[str, int]:
        """topic -> the partition count its queues route over: layout 0's own, a later
        layout's from its layout record."""
        return {t: len(ps) if layout_of_topic(t) == 0 else self.layouts.get(layout_of_topic(t), 0)
                for t, ps in topics.items()}

    def legacy_topic(self) -> str:
        """The topic a checkpoint from before multi-topic offsets read: layout 0's."""
        if self.sub.topic:
            return self.sub.topic
        zero = sorted(t for t in self.matched() if layout_of_topic(t) == 0)
        if len(zero) != 1:
            raise RuntimeError(
                f"{SOURCE_NAME}: the checkpoint holds the offsets of one topic (written before "
                f"this source read several), and {self.sub} matches {len(zero)} topics that are "
                f"not a later layout's ({', '.join(zero) or 'none'}): resume it with the "
                "pattern of the configured data topic (vqueues.layouts.topic_pattern), or start "
                "a new checkpoint")
        return zero[0]

    def partitions_of(self, offsets: Offsets) -> dict[str, list[int]]:
        return {t: [int(p) for p in parts] for t, parts in offsets.items()}

    def earliest(self, topics: dict[str, list[int]]) -> Offsets:
        client = self._client()
        return {t: {str(p): o for p, o in client.earliest(ps, topic=t).items()}
                for t, ps in topics.items()}

    def ends(self, topics: dict[str, list[int]]) -> Offsets:
        client = self._client()
        return {t: {str(p): o for p, o in client.ends(ps, topic=t).items()}
                for t, ps in topics.items()}

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class VQueuesKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, conf: dict[str, str], sub: Subscription, starting: Any,
                 max_per_trigger: int | None, buckets: int | None = None,
                 reading: Reading | None = None) -> None:
        self.buckets = buckets
        self.reading = reading or Reading()
        self.conf = conf
        self.sub = sub
        self.starting = starting
        self.max_per_trigger = max_per_trigger
        self.topics = Topics(conf, sub, self.reading)
        self._target: Offsets | None = None
        self._seen: Offsets = {}  # the ends seen last, per topic

    def _offsets(self, raw: dict[str, Any]) -> Offsets:
        return from_checkpoint(raw, self.topics.legacy_topic)

    def initialOffset(self) -> Offsets:
        topics = self.topics.matched()
        earliest = self.topics.earliest(topics)
        ends = earliest if self.starting == "earliest" else self.topics.ends(topics)
        return resolve(self.starting, earliest, ends, earliest)

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self.topics.ends(self.topics.matched())

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> Offsets:
        begin = self._offsets(start)
        topics = self.topics.matched()
        if self._target is not None:
            ends = {t: parts for t, parts in self._target.items() if t in topics}
        else:
            ends = self.topics.ends(topics)
        self._seen.update(ends)
        lost = unread_when_gone(begin, ends, self._seen)
        if lost and self.reading.fail_on_data_loss:
            raise RuntimeError(
                f"{SOURCE_NAME}: topics {sorted(lost)} were deleted before this query read "
                f"them to their end (from {json.dumps(lost)}), or before it saw their end "
                "since it started. If that is expected (a retired layout whose records were "
                "read), restart the query with failOnDataLoss=false")
        # Topics and partitions that appeared since `start` begin at their earliest offset.
        new = {t: [int(p) for p in parts if p not in begin.get(t, {})]
               for t, parts in ends.items()}
        new = {t: ps for t, ps in new.items() if ps}
        if new:
            for t, parts in self.topics.earliest(new).items():
                begin.setdefault(t, {}).update(parts)
        end = {t: {p: max(begin[t][p], o) for p, o in parts.items()} for t, parts in ends.items()}
        if isinstance(limit, ReadMaxRows):
            end = _cap(begin, end, limit.max_rows)
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, until = self._offsets(start), self._offsets(end)
        topics = self.topics.partitions_of(until)
        earliest = self.topics.earliest(topics)
        if self.reading.needs_layouts:
            self.topics.matched()  # learns the layouts of a batch planned before a restart
        return list(plan(begin, until, earliest, self.reading, self.topics.routes(topics),
                         self.topics.layouts))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRange)
        yield from read_records(self.conf, partition, self.buckets, self.reading)

    def commit(self, end: dict[str, Any]) -> None:
        pass  # offsets live in Spark's checkpoint; nothing to commit to Kafka

    def stop(self) -> None:
        self.topics.close()


def _cap(begin: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Split `max_rows` over the partitions in proportion to their backlog (as Spark does)."""
    lag = {(t, p): end[t][p] - begin[t][p] for t in end for p in end[t]}
    total = sum(lag.values())
    if total <= max_rows:
        return end
    out = {}
    given = 0
    for k in sorted(lag, key=lambda k: (k[0], int(k[1]))):
        share = lag[k] * max_rows // total
        out[k] = begin[k[0]][k[1]] + share
        given += share
    # Hand out what rounding left, to the largest backlogs first.
    for k in sorted(lag, key=lambda k: -(lag[k] - (out[k] - begin[k[0]][k[1]]))):
        if given >= max_rows:
            break
        if out[k] < end[k[0]][k[1]]:
            out[k] += 1
            given += 1
    if all(out[k] == begin[k[0]][k[1]] for k in out):  # always make progress
        k = max(lag, key=lambda k: lag[k])
        out[k] = begin[k[0]][k[1]] + 1
    capped: Offsets = {t: {} for t in end}
    for (t, p), o in out.items():
        capped[t][p] = o
    return capped


class VQueuesKafkaBatchReader(DataSourceReader):
    """`spark.read.format("vqueues-kafka")`: the records from startingOffsets (default
    earliest) to endingOffsets (default latest), fixed when the read is planned."""

    def __init__(self, conf: dict[str, str], sub: Subscription, starting: Any, ending: Any,
                 buckets: int | None, reading: Reading) -> None:
        self.conf = conf
        self.sub = sub
        self.starting = starting
        self.ending = ending
        self.buckets = buckets
        self.reading = reading

    def partitions(self) -> list[InputPartition]:
        topics = Topics(self.conf, self.sub, self.reading)
        try:
            matched = topics.matched()
            earliest = topics.earliest(matched)
            ends = topics.ends(matched)
        finally:
            topics.close()
        start = resolve(self.starting, earliest, ends, earliest)
        end = resolve(self.ending, earliest, ends, ends)
        end = {t: {p: min(max(o, start[t][p]), ends[t][p]) for p, o in parts.items()}
               for t, parts in end.items()}
        return list(plan(start, end, earliest, self.reading, topics.routes(matched),
                         topics.layouts))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRange)
        yield from read_records(self.conf, partition, self.buckets, self.reading)
