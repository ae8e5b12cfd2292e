"""A Spark Structured Streaming source for a Kafka topic, with PySpark's Python Data Source API.

Registered as `vqueues-kafka`. Columns are those of Spark's own Kafka source (`key, value, topic,
partition, offset, timestamp, timestampType, headers`) plus `queue`, the key as a string. Options
use Spark's Kafka source names, so switching to `format("kafka")` is a one-word change:

  kafka.bootstrap.servers   required
  subscribe                 the topic (one)
  startingOffsets           earliest (default) | latest | {"topic": {"0": 42, "1": -2}}
                            (-2: earliest, -1: latest)
  maxOffsetsPerTrigger      most records per micro-batch (default: all available)
  queueBuckets              N: add a column `bucket int`, the archive bucket of the record's
                            queue (mmh3, vqueues/pipeline/layout.py), computed in the reader
  kafka.*                   passed to the Kafka client (security.protocol, sasl.*, ssl.*, ...)

Offsets are {"<partition>": next offset} (JSON keys are strings). End offsets are found by
consuming to EOF, so they are right on Kafka and on the embedded broker alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
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
# A Spark task reads at most this many records; larger ranges are split.
MAX_RECORDS_PER_TASK = 250_000


@dataclass(frozen=True)
class KafkaRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


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
        self.conf = _kafka_conf(opts)
        self.topic = opts.get("subscribe") or opts.get("topic") or ""
        if not self.topic or "," in self.topic:
            raise ValueError(f"{SOURCE_NAME}: option subscribe must name exactly one topic")
        raw_start = opts.get("startingoffsets", "earliest")
        self.starting: str | dict[str, int] = raw_start
        if raw_start not in ("earliest", "latest"):
            try:
                parsed = json.loads(raw_start)[self.topic]
                self.starting = {str(p): int(o) for p, o in parsed.items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                raise ValueError(f"{SOURCE_NAME}: startingOffsets must be earliest, latest or "
                                 f'{{"{self.topic}": {{"0": offset, ...}}}}') from None
        raw_max = opts.get("maxoffsetspertrigger")
        self.max_per_trigger = int(raw_max) if raw_max else None
        if self.max_per_trigger is not None and self.max_per_trigger < 1:
            raise ValueError(f"{SOURCE_NAME}: maxOffsetsPerTrigger must be at least 1")
        raw_buckets = opts.get("queuebuckets")
        self.buckets = int(raw_buckets) if raw_buckets else None
        if self.buckets is not None and self.buckets < 1:
            raise ValueError(f"{SOURCE_NAME}: queueBuckets must be at least 1")

    def schema(self) -> str:
        return SCHEMA + (", bucket int" if self.buckets else "")

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return VQueuesKafkaStreamReader(self.conf, self.topic, self.starting,
                                        self.max_per_trigger, self.buckets)


class VQueuesKafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, conf: dict[str, str], topic: str, starting: Any,
                 max_per_trigger: int | None, buckets: int | None = None) -> None:
        self.buckets = buckets
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
        out: list[InputPartition] = []
        for p, until in sorted(end.items(), key=lambda kv: int(kv[0])):
            frm = start.get(p, until)
            while frm < until:
                nxt = min(until, frm + MAX_RECORDS_PER_TASK)
                out.append(KafkaRange(self.topic, int(p), frm, nxt))
                frm = nxt
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        from vqueues.kafka.ranges import read_range
        from vqueues.pipeline.arrow import to_record_batch, with_bucket
        from vqueues.pipeline.layout import BucketMemo

        assert isinstance(partition, KafkaRange)
        bucket_of = BucketMemo(self.buckets) if self.buckets else None
        for msgs in read_range(self.conf, partition.topic, partition.partition,
                               partition.start, partition.end):
            batch = to_record_batch(msgs)
            yield with_bucket(batch, bucket_of) if bucket_of is not None else batch

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
