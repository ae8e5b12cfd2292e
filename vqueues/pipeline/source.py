"""A Spark Structured Streaming source for a Kafka topic, with PySpark's Python Data Source API.

Registered as `vqueues-kafka`. Columns are those of Spark's own Kafka source (`key, value, topic,
partition, offset, timestamp, timestampType, headers`) plus `queue`, the key as a string. Options
use Spark's Kafka source names, so switching to `format("kafka")` is a one-word change:

  kafka.bootstrap.servers   required
  subscribe                 the topic (one)
  startingOffsets           earliest (default) | latest | {"topic": {"0": 42, "1": -2}}
                            (-2: earliest, -1: latest)
  maxOffsetsPerTrigger      most records per micro-batch (default: all available)
  endingOffsets             (batch reads, spark.read) latest (default) | {"topic": {"0": n}}
  failOnDataLoss            true (default): fail when a start offset is below the partition's
                            first retained offset (retention deleted records); false: go on
                            from the first retained offset
  minPartitions             at least this many Spark tasks per batch (ranges are split)
  queues                    a JSON list of queue names: only their records, and only the
                            Kafka partitions they route to are read (pushed down to the readers)
  skipDeletedQueues         true: drop records hidden by a queue deletion (the deletion markers
                            in the offset topic, option deletionTopic, default vq-offsets)
  queueBuckets              N: add a column `bucket int`, the archive bucket of the record's
                            queue (mmh3, vqueues/pipeline/layout.py), computed in the reader
  kafka.*                   passed to the Kafka client (security.protocol, sasl.*, ssl.*, ...)

Offsets are {"<partition>": next offset} (JSON keys are strings). End offsets are found by
consuming to EOF, so they are right on Kafka and on the embedded broker alike.

Options of Spark's Kafka source that would change which records are read, and that this source
cannot honour, are refused by name (`REFUSED`) rather than ignored; options that only tune
Spark's own consumer are accepted and have no effect (`IGNORED`). docs/pipeline.md has the table,
checked against Spark's connector by tests/test_pipeline.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
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

SOURCE_NAME = "vqueues-kafka"
SCHEMA = ("key binary, value binary, topic string, partition int, offset long, "
          "timestamp timestamp, timestampType int, "
          "headers array<struct<key: string, value: binary>>, queue string")
# Spark's Kafka source options this source refuses (lower case, as Spark passes them): why.
REFUSED = {
    "subscribepattern": "one data topic per vqueues cluster: use subscribe, and queues to narrow",
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


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class Reading:
    """How ranges are planned and read (options shared by streaming and batch reads)."""

    fail_on_data_loss: bool = True
    min_partitions: int = 0
    queues: tuple[str, ...] | None = None  # only these queues' records (and partitions)
    deletion_topic: str | None = None  # skip records hidden by deletion markers there


def _offsets_option(raw: str, topic: str, name: str) -> str | dict[str, int]:
    if raw in ("earliest", "latest"):
        return raw
    try:
        parsed = json.loads(raw)[topic]
        return {str(p): int(o) for p, o in parsed.items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{SOURCE_NAME}: {name} must be earliest, latest or "
                         f'{{"{topic}": {{"0": offset, ...}}}}') from None


def plan(topic: str, start: dict[str, int], end: dict[str, int], earliest: dict[str, int],
         reading: Reading, partitions: int) -> list[KafkaRange]:
    """The ranges to read: per partition [start, end), without the partitions the queue filter
    rules out, from the first retained offset when retention passed the start (or an error with
    failOnDataLoss), split so that there are at least minPartitions ranges."""
    wanted: set[int] | None = None
    if reading.queues is not None:
        from vqueues.hashing import partition_for

        wanted = {partition_for(q, partitions) for q in reading.queues}
    ranges = []
    for p, until in sorted(end.items(), key=lambda kv: int(kv[0])):
        if wanted is not None and int(p) not in wanted:
            continue
        frm = start.get(p, until)
        first = earliest.get(p, 0)
        if frm < first:
            if reading.fail_on_data_loss:
                raise RuntimeError(
                    f"{SOURCE_NAME}: {topic}[{p}] starts at {first} now; offsets {frm}-{first - 1} "
                    "were deleted (retention) before they were read. Set failOnDataLoss=false "
                    "to go on from the first retained offset")
            frm = first
        while frm < until:
            nxt = min(until, frm + MAX_RECORDS_PER_TASK)
            ranges.append(KafkaRange(topic, int(p), frm, nxt))
            frm = nxt
    while ranges and len(ranges) < reading.min_partitions:
        big = max(ranges, key=lambda r: r.end - r.start)
        if big.end - big.start < 2:
            break
        mid = (big.start + big.end) // 2
        i = ranges.index(big)
        ranges[i:i + 1] = [KafkaRange(topic, big.partition, big.start, mid),
                           KafkaRange(topic, big.partition, mid, big.end)]
    return ranges


def read_records(conf: dict[str, str], r: KafkaRange, buckets: int | None, reading: Reading
                 ) -> Iterator[Any]:
    """The Arrow record batches of one range, filtered as `reading` says."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from vqueues.kafka.ranges import read_range
    from vqueues.pipeline.arrow import to_record_batch, with_bucket

    keep = pa.array(list(reading.queues), pa.string()) if reading.queues is not None else None
    deleted = (_deletion_floors(conf, reading.deletion_topic, r.partition)
               if reading.deletion_topic else None)
    for msgs in read_range(conf, r.topic, r.partition, r.start, r.end):
        batch = to_record_batch(msgs)
        if keep is not None:
            batch = batch.filter(pc.is_in(batch.column("queue"), value_set=keep))
        if deleted:
            queues = batch.column("queue").to_pylist()
            offsets = batch.column("offset").to_pylist()
            mask = [deleted.get(q, -1) <= o for q, o in zip(queues, offsets, strict=True)]
            batch = batch.filter(pa.array(mask, pa.bool_()))
        if batch.num_rows:
            yield with_bucket(batch, buckets) if buckets else batch


def _deletion_floors(conf: dict[str, str], topic: str, partition: int) -> dict[str, int]:
    """queue -> deleted_before, from the deletion markers in offset partition `partition`."""
    from vqueues.kafka.logs import read_to_end
    from vqueues.records import QueueDeleted, decode_offset_entry

    floors: dict[str, int] = {}
    entries, _ = read_to_end({**conf, "group.id": "vqueues-deletions"}, topic, [partition])[
        partition]
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
        self.topic = opts.get("subscribe") or opts.get("topic") or ""
        if not self.topic or "," in self.topic:
            raise ValueError(f"{SOURCE_NAME}: option subscribe must name exactly one topic")
        self.starting = _offsets_option(opts.get("startingoffsets", "earliest"), self.topic,
                                        "startingOffsets")
        raw_max = opts.get("maxoffsetspertrigger")
        self.max_per_trigger = int(raw_max) if raw_max else None
        if self.max_per_trigger is not None and self.max_per_trigger < 1:
            raise ValueError(f"{SOURCE_NAME}: maxOffsetsPerTrigger must be at least 1")
        raw_buckets = opts.get("queuebuckets")
        self.buckets = int(raw_buckets) if raw_buckets else None
        if self.buckets is not None and self.buckets < 1:
            raise ValueError(f"{SOURCE_NAME}: queueBuckets must be at least 1")
        self.ending = _offsets_option(opts.get("endingoffsets", "latest"), self.topic,
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

    def schema(self) -> str:
        return SCHEMA + (", bucket int" if self.buckets else "")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return VQueuesKafkaStreamReader(self.conf, self.topic, self.starting,
                                        self.max_per_trigger, self.buckets, self._reading())

    def reader(self, schema: StructType) -> DataSourceReader:
        """A batch read (`spark.read`) from startingOffsets to endingOffsets."""
        return VQueuesKafkaBatchReader(self.conf, self.topic, self.starting, self.ending,
                                       self.buckets, self._reading())

    def _reading(self) -> Reading:
        return Reading(self.fail_on_data_loss, self.min_partitions,
                       tuple(self.queues) if self.queues is not None else None,
                       self.deletion_topic if self.skip_deleted else None)


class VQueuesKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, conf: dict[str, str], topic: str, starting: Any,
                 max_per_trigger: int | None, buckets: int | None = None,
                 reading: Reading | None = None) -> None:
        self.buckets = buckets
        self.reading = reading or Reading()
        self.conf = conf
        self.topic = topic
        self.starting = starting
        self.max_per_trigger = max_per_trigger
        self._ranges: Any = None  # driver-side Kafka client, opened lazily (never pickled)
        self._target: dict[str, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_ranges"] = None
        return state

    def _client(self) -> Any:
        if self._ranges is None:
            from vqueues.kafka.ranges import OffsetRanges

            self._ranges = OffsetRanges(self.conf, self.topic)
        return self._ranges

    def _ends(self) -> dict[str, int]:
        client = self._client()
        return {str(p): e for p, e in client.ends(client.partitions()).items()}

    def initialOffset(self) -> dict[str, int]:
        client = self._client()
        parts = client.partitions()
        if self.starting == "latest":
            return self._ends()
        earliest = {str(p): o for p, o in client.earliest(parts).items()}
        if self.starting == "earliest":
            return earliest
        ends = self._ends()
        out = {}
        for p in map(str, parts):
            o = self.starting.get(p, -2)
            out[p] = earliest[p] if o == -2 else ends[p] if o == -1 else o
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_per_trigger) if self.max_per_trigger else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._ends()

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        ends = self._target if self._target is not None else self._ends()
        # Partitions that appeared since `start` begin at their earliest offset.
        earliest = None
        begin = {}
        for p in ends:
            if p in start:
                begin[p] = start[p]
            else:
                earliest = earliest or {str(k): v for k, v in
                                        self._client().earliest([int(x) for x in ends]).items()}
                begin[p] = earliest[p]
        end = {p: max(begin[p], ends[p]) for p in ends}
        if isinstance(limit, ReadMaxRows):
            end = _cap(begin, end, limit.max_rows)
        return end

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        client = self._client()
        earliest = {str(p): o for p, o in client.earliest([int(p) for p in end]).items()}
        return list(plan(self.topic, start, end, earliest, self.reading, len(end)))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRange)
        yield from read_records(self.conf, partition, self.buckets, self.reading)

    def commit(self, end: dict[str, int]) -> None:
        pass  # offsets live in Spark's checkpoint; nothing to commit to Kafka

    def stop(self) -> None:
        if self._ranges is not None:
            self._ranges.close()
            self._ranges = None


def _cap(begin: dict[str, int], end: dict[str, int], max_rows: int) -> dict[str, int]:
    """Split `max_rows` over the partitions in proportion to their backlog (as Spark does)."""
    lag = {p: end[p] - begin[p] for p in end}
    total = sum(lag.values())
    if total <= max_rows:
        return end
    out = {}
    given = 0
    for p in sorted(lag, key=lambda k: int(k)):
        share = lag[p] * max_rows // total
        out[p] = begin[p] + share
        given += share
    # Hand out what rounding left, to the largest backlogs first.
    for p in sorted(lag, key=lambda k: -(lag[k] - (out[k] - begin[k]))):
        if given >= max_rows:
            break
        if out[p] < end[p]:
            out[p] += 1
            given += 1
    if all(out[p] == begin[p] for p in out):  # always make progress
        p = max(lag, key=lambda k: lag[k])
        out[p] = begin[p] + 1
    return out


class VQueuesKafkaBatchReader(DataSourceReader):
    """`spark.read.format("vqueues-kafka")`: the records from startingOffsets (default
    earliest) to endingOffsets (default latest), fixed when the read is planned."""

    def __init__(self, conf: dict[str, str], topic: str, starting: Any, ending: Any,
                 buckets: int | None, reading: Reading) -> None:
        self.conf = conf
        self.topic = topic
        self.starting = starting
        self.ending = ending
        self.buckets = buckets
        self.reading = reading

    def partitions(self) -> list[InputPartition]:
        from vqueues.kafka.ranges import OffsetRanges

        client = OffsetRanges(self.conf, self.topic)
        try:
            parts = client.partitions()
            earliest = {str(p): o for p, o in client.earliest(parts).items()}
            ends = {str(p): o for p, o in client.ends(parts).items()}
        finally:
            client.close()

        def resolve(spec: Any, default: dict[str, int]) -> dict[str, int]:
            if spec == "earliest":
                return dict(earliest)
            if spec == "latest":
                return dict(ends)
            return {p: (earliest[p] if spec.get(p, -3) == -2 else ends[p]
                        if spec.get(p, -3) == -1 else spec.get(p, default[p]))
                    for p in map(str, parts)}

        start = resolve(self.starting, earliest)
        end = resolve(self.ending, ends)
        end = {p: min(max(end[p], start[p]), ends[p]) for p in end}
        return list(plan(self.topic, start, end, earliest, self.reading, len(parts)))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRange)
        yield from read_records(self.conf, partition, self.buckets, self.reading)
