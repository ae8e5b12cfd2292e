"""The Spark pipeline on a local Spark (local[2]) against the real (embedded) broker."""

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from tests.support import kafka_records
from vqueues.hashing import partition_for
from vqueues.kafka.admin import Admin, TopicSpec
from vqueues.kafka.ranges import OffsetRanges
from vqueues.layouts import (
    CUT_HEADER,
    FORWARDED_HEADER,
    Layout,
    encode_layout,
    layout_of_topic,
    tag,
    topic_name,
    topic_pattern,
)

pyspark = pytest.importorskip("pyspark", reason="the pipeline extra (pyspark) is not installed")

from vqueues.kafka.maven import JarsUnavailable  # noqa: E402
from vqueues.pipeline.jobs import (  # noqa: E402
    PipelineOptions,
    run,
    spark_kafka_jars,
    spark_session,
)
from vqueues.pipeline.source import IGNORED, REFUSED  # noqa: E402

QUEUES = ["orders", "tenant/42/jobs", "k=v", "ünïcødé-😀", "a::b"]
MINUTE_MS = 60_000


def _connector() -> tuple[list[str], str]:
    """Spark's Kafka connector jars (fetched by Maven), or why there are none."""
    try:
        return spark_kafka_jars(), ""
    except JarsUnavailable as exc:
        return [], str(exc)


@pytest.fixture(scope="module")
def spark():
    # With Spark's own Kafka connector on the classpath, so both sources can be compared.
    jars, _ = _connector()
    session = spark_session("local[2]", jars=jars)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def kafka_source(spark):
    """The session, once Spark's Kafka source ("kafka") is known to load."""
    jars, why = _connector()
    if not jars:
        pytest.skip(f"Spark's Kafka connector could not be fetched: {why}")
    return spark


def new_topic(bootstrap, partitions=4):
    name = f"pipe-{uuid.uuid4().hex[:8]}"
    Admin({"bootstrap.servers": bootstrap}).create([TopicSpec(name, partitions)])
    return name


def produce(bootstrap, topic, count, start_ms, spread_minutes=5, tag="r"):
    """`count` records over QUEUES, timestamps spread over `spread_minutes` minutes; batched."""
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2", "linger.ms": 20})
    sent = []
    for i in range(count):
        q = QUEUES[i % len(QUEUES)]
        ts = start_ms + (i * spread_minutes * MINUTE_MS) // count
        value = f"{tag}{i}".encode() * (1 + i % 3)
        p.produce(topic, key=q.encode(), value=value, timestamp=ts,
                  headers=[("n", str(i).encode())])
        sent.append((q, ts, value))
    assert p.flush(30) == 0
    return sent


def archived(spark, out):
    rows = spark.read.parquet(str(out / "archive")).collect()
    return [(r.partition, r.offset, r.queue, bytes(r.value), int(r.timestamp.timestamp() * 1000),
             tuple((h.key, bytes(h.value)) for h in r.headers)) for r in rows]


def options(bootstrap, topic, tmp, **kw):
    return PipelineOptions(bootstrap=bootstrap, topic=topic, output=str(tmp / "out"),
                           checkpoint=str(tmp / "ckpt"), **kw)


@pytest.mark.both_brokers
def test_true_end_offsets_on_this_broker_even_when_producers_batch(bootstrap):
    topic = new_topic(bootstrap)
    produce(bootstrap, topic, 2000, int(time.time() * 1000))
    per_partition = Counter(p for p, _ in kafka_records(bootstrap, topic))
    ranges = OffsetRanges({"bootstrap.servers": bootstrap}, topic)
    try:
        parts = ranges.partitions()
        assert ranges.ends(parts) == {p: per_partition.get(p, 0) for p in parts}
    finally:
        ranges.close()


@pytest.mark.both_brokers
def test_archive_holds_exactly_the_records_and_a_restart_adds_no_duplicate_or_gap(
        spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap)
    start = int(time.time() * 1000) - 30 * MINUTE_MS
    produce(bootstrap, topic, 1500, start, tag="first")
    run(spark, options(bootstrap, topic, tmp_path))
    first = archived(spark, tmp_path / "out")
    assert len(first) == 1500
    # The query is stopped; more records arrive; the query restarts from its checkpoint.
    produce(bootstrap, topic, 700, start + 10 * MINUTE_MS, tag="second")
    run(spark, options(bootstrap, topic, tmp_path))
    rows = archived(spark, tmp_path / "out")
    keys = [(p, o) for p, o, *_ in rows]
    assert len(keys) == len(set(keys)) == 2200, "duplicates or gaps after the restart"
    expected = kafka_records(bootstrap, topic)
    assert set(keys) == set(expected)
    for p, o, queue, value, ts, headers in rows:
        k_queue, k_value, k_ts, k_headers = expected[(p, o)]
        assert (queue, value, ts, headers) == (k_queue, k_value, k_ts, k_headers)


def test_queue_names_with_slash_equals_and_unicode_are_archived_and_read_back(
        spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap)
    sent = produce(bootstrap, topic, 250, int(time.time() * 1000))
    run(spark, options(bootstrap, topic, tmp_path, jobs=("archive",)))
    table = spark.read.parquet(str(tmp_path / "out" / "archive"))
    counts = {r.queue: r["count"] for r in table.groupBy("queue").count().collect()}
    assert counts == dict(Counter(q for q, _, _ in sent))
    for q in QUEUES:
        only = table.where(table.queue == q).collect()
        assert only and {r.queue for r in only} == {q}


def test_metrics_equal_counts_and_bytes_computed_independently(spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap)
    start = (int(time.time() * 1000) // MINUTE_MS - 20) * MINUTE_MS
    sent = produce(bootstrap, topic, 1200, start, spread_minutes=6)
    # A later record moves the watermark past the last full minute.
    produce(bootstrap, topic, 1, start + 15 * MINUTE_MS, tag="late")
    run(spark, options(bootstrap, topic, tmp_path, jobs=("metrics",)))
    expected: dict[Any, Any] = {}
    for q, ts, value in sent:
        key = (q, ts // MINUTE_MS * MINUTE_MS)
        n, b = expected.get(key, (0, 0))
        expected[key] = (n + 1, b + len(value))
    rows = spark.read.parquet(str(tmp_path / "out" / "metrics")).collect()
    got = {(r.queue, int(r.minute.timestamp() * 1000)): (r.records, r.bytes) for r in rows}
    assert got == expected  # every closed minute, exactly; the late record's minute is open


def test_max_offsets_per_trigger_splits_the_backlog_into_bounded_micro_batches(
        spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap)
    produce(bootstrap, topic, 1000, int(time.time() * 1000))
    (query,) = run(spark, options(bootstrap, topic, tmp_path, jobs=("archive",),
                                  max_records_per_trigger=300), wait=False)
    query.awaitTermination()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes) == 1000 and max(sizes) <= 300 and len(sizes) >= 4


def test_starting_offsets_latest_and_per_partition_json(spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap, partitions=2)
    produce(bootstrap, topic, 100, int(time.time() * 1000))
    run(spark, options(bootstrap, topic, tmp_path / "latest", jobs=("archive",),
                       starting_offsets="latest"))
    assert list((tmp_path / "latest/out/archive").rglob("*.parquet")) == []
    ends = Counter(p for p, _ in kafka_records(bootstrap, topic))
    start = json.dumps({topic: {"0": ends[0] - 3, "1": -2}})
    run(spark, options(bootstrap, topic, tmp_path / "json", jobs=("archive",),
                       starting_offsets=start))
    rows = archived(spark, tmp_path / "json/out")
    assert Counter(p for p, *_ in rows) == {p: n for p, n in {0: 3, 1: ends[1]}.items() if n}


def test_a_processing_time_trigger_keeps_up_with_new_records(spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap)
    (query,) = run(spark, options(bootstrap, topic, tmp_path, jobs=("archive",),
                                  trigger="1 second"), wait=False)
    try:
        produce(bootstrap, topic, 300, int(time.time() * 1000))
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            query.processAllAvailable()
            if spark.read.parquet(str(tmp_path / "out/archive")).count() >= 300:
                break
            time.sleep(0.5)
        assert spark.read.parquet(str(tmp_path / "out/archive")).count() == 300
    finally:
        query.stop()


def test_the_pipeline_command_runs_end_to_end(bootstrap, tmp_path):
    topic = new_topic(bootstrap)
    produce(bootstrap, topic, 200, int(time.time() * 1000))
    out = subprocess.run(
        [sys.executable, "-m", "vqueues", "pipeline", "run", "--bootstrap", bootstrap,
         "--topic", topic, "--output", str(tmp_path / "out"), "--checkpoint",
         str(tmp_path / "ckpt"), "--master", "local[2]", "--jobs", "archive"],
        capture_output=True, text=True, timeout=300, env={**os.environ})
    assert out.returncode == 0, out.stderr[-3000:]
    files = list(Path(tmp_path / "out/archive").rglob("*.parquet"))
    # The archive layout (vqueues/pipeline/layout.py): date=<d>/bucket=<b>/, never by queue.
    assert files and {f.parent.parent.name.split("=")[0] for f in files} == {"date"}
    assert {f.parent.name.split("=")[0] for f in files} == {"bucket"}


LONG_NAMES = [
    "/".join(["tenant", "acme", "region", "eu"] + [f"l{i:02d}" for i in range(60)])[:249],
    "é" * 124,  # 248 bytes of two-byte UTF-8
    "日本" * 41 + "x",  # 247 bytes of three-byte UTF-8
    "k=v%2F 100% spaces here", "../..", "a/../b", "=", "%",
]


def test_any_valid_queue_name_is_archived_and_read_back_unchanged(spark, bootstrap, tmp_path):
    from vqueues.names import validate_name
    from vqueues.pipeline.jobs import read_queue
    from vqueues.pipeline.layout import archive_bucket

    for name in LONG_NAMES:
        validate_name(name, "queue")  # each is a valid vqueues name
    assert max(len(n.encode()) for n in LONG_NAMES) == 249
    topic = new_topic(bootstrap)
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2"})
    for i in range(300):
        p.produce(topic, key=LONG_NAMES[i % len(LONG_NAMES)].encode(), value=f"v{i}".encode())
    p.produce(topic, key=None, value=b"keyless")
    assert p.flush(30) == 0
    run(spark, options(bootstrap, topic, tmp_path, jobs=("archive",)))
    path = str(tmp_path / "out" / "archive")
    table = spark.read.parquet(path)
    counts = {r.queue: r["count"] for r in table.groupBy("queue").count().collect()}
    expected: dict[str | None, int] = {
        **{n: 300 // len(LONG_NAMES) + (i < 300 % len(LONG_NAMES))
           for i, n in enumerate(LONG_NAMES)}, None: 1}
    assert counts == expected
    # Every row's bucket is the standard mmh3 bucket any Python reader computes without Spark.
    for r in table.select("queue", "bucket").distinct().collect():
        assert r.bucket == archive_bucket(r.queue)
    for name in LONG_NAMES:
        rows = read_queue(spark, path, name).collect()
        assert {r.queue for r in rows} == {name}
        assert [(r.partition, r.offset) for r in rows] == sorted((r.partition, r.offset)
                                                                 for r in rows)
    # Reading one queue touches its bucket's directories only.
    plan = read_queue(spark, path, LONG_NAMES[0])._jdf.queryExecution().executedPlan().toString()
    assert "PartitionFilters" in plan and "bucket" in plan


def test_a_micro_batch_writes_at_most_archive_writers_files_per_date_and_bucket(
        spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap)
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2", "linger.ms": 20})
    now = int(time.time() * 1000)
    for i in range(3000):
        p.produce(topic, key=f"q{i % 1000}".encode(), value=b"x", timestamp=now)
    assert p.flush(30) == 0
    for writers in (1, 2):
        out = tmp_path / f"w{writers}"
        run(spark, options(bootstrap, topic, out, jobs=("archive",), archive_buckets=8,
                           archive_writers=writers))
        files = list(Path(out / "out/archive").rglob("*.parquet"))
        per_dir = Counter(f.parent for f in files)
        assert len(per_dir) <= 8 * 2  # 8 buckets, the date may roll over during the test
        assert max(per_dir.values()) <= writers, per_dir
        if writers == 1:
            assert len(files) == len(per_dir)  # one file per (date, bucket)
        assert spark.read.parquet(str(out / "out/archive")).count() == 3000


def test_an_archive_of_the_old_layout_migrates_with_one_job(spark, tmp_path):
    from vqueues.pipeline.jobs import migrate_archive, read_queue

    rows = [("tenant/1", "2026-01-01", 0, i, f"v{i}".encode()) for i in range(5)]
    rows += [("__no_queue__", "2026-01-01", 1, 7, b"k")]
    old = spark.createDataFrame(rows, "queue string, date string, partition int, offset long, "
                                      "value binary")
    old = old.selectExpr("*", "timestamp'2026-01-01 10:00:00' as timestamp",
                         "cast(null as array<struct<key:string,value:binary>>) as headers",
                         "cast(queue as binary) as key")
    old.write.partitionBy("queue", "date").parquet(str(tmp_path / "old"))
    assert migrate_archive(spark, str(tmp_path / "old"), str(tmp_path / "new")) == 6
    got = read_queue(spark, str(tmp_path / "new"), "tenant/1").collect()
    assert [r.offset for r in got] == list(range(5))
    nulls = spark.read.parquet(str(tmp_path / "new")).where("queue is null").count()
    assert nulls == 1
    with pytest.raises(FileExistsError):  # never into an archive that holds files
        migrate_archive(spark, str(tmp_path / "old"), str(tmp_path / "new"))


def batch_reader(spark, bootstrap, topic, **options):
    reader = spark.read.format("vqueues-kafka").option("kafka.bootstrap.servers", bootstrap)
    if topic is not None:
        reader = reader.option("subscribe", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def test_batch_reads_stop_at_ending_offsets_and_split_into_min_partitions(
        spark, bootstrap, tmp_path):
    topic = new_topic(bootstrap, partitions=2)
    produce(bootstrap, topic, 400, int(time.time() * 1000))
    per_partition = Counter(p for p, _ in kafka_records(bootstrap, topic))
    assert batch_reader(spark, bootstrap, topic).count() == 400  # earliest -> latest
    ending = json.dumps({topic: {"0": 10, "1": -1}})
    df = batch_reader(spark, bootstrap, topic, endingOffsets=ending)
    assert df.count() == 10 + per_partition[1]
    df = batch_reader(spark, bootstrap, topic, minPartitions="8")
    assert df.rdd.getNumPartitions() >= 8 and df.count() == 400


def test_a_queue_filter_is_pushed_down_to_the_readers(spark, bootstrap, tmp_path):

    topic = new_topic(bootstrap, partitions=4)
    sent = produce(bootstrap, topic, 500, int(time.time() * 1000))
    df = batch_reader(spark, bootstrap, topic, queues=json.dumps(["orders"]))
    rows = df.select("queue", "partition").collect()
    assert {r.queue for r in rows} == {"orders"}
    assert len(rows) == sum(1 for q, _, _ in sent if q == "orders")
    # Only the partition "orders" routes to is read at all.
    assert {r.partition for r in rows} == {partition_for("orders", 4)}
    assert df.rdd.getNumPartitions() == 1


@pytest.mark.both_brokers
def test_records_hidden_by_a_queue_deletion_can_be_skipped(spark, bootstrap, tmp_path):
    from vqueues.records import QueueDeleted, encode_offset_entry

    topic = new_topic(bootstrap, partitions=4)
    offsets_topic = new_topic(bootstrap, partitions=4)
    produce(bootstrap, topic, 100, int(time.time() * 1000), tag="old")
    p = partition_for("orders", 4)
    cut = max(o for (part, o), rec in kafka_records(bootstrap, topic).items()
              if part == p and rec[0] == "orders") + 1
    producer = Producer({"bootstrap.servers": bootstrap})
    key, value = encode_offset_entry(QueueDeleted("orders", cut))
    producer.produce(offsets_topic, key=key, value=value, partition=p)
    assert producer.flush(10) == 0
    produce(bootstrap, topic, 50, int(time.time() * 1000), tag="new")
    kept = batch_reader(spark, bootstrap, topic, skipDeletedQueues="true",
                        deletionTopic=offsets_topic).collect()
    orders = [r for r in kept if r.queue == "orders"]
    assert orders and all(r.offset >= cut for r in orders)
    assert all(bytes(r.value).startswith(b"new") for r in orders)
    everything = batch_reader(spark, bootstrap, topic).count()
    assert len(kept) == everything - sum(1 for r in kafka_records(bootstrap, topic).items()
                                         if r[0][0] == p and r[1][0] == "orders"
                                         and r[0][1] < cut)


# Spark's Kafka source on the embedded broker reads wrong end offsets (its latest-offset look-ups,
# docs/embedded-broker.md): the two sources are compared on real Kafka.
COMPARED_OPTIONS = [
    {},
    {"startingOffsets": "PER_PARTITION_START", "endingOffsets": "PER_PARTITION_END"},
    {"minPartitions": "7"},
    {"failOnDataLoss": "false", "kafkaConsumer.pollTimeoutMs": "5000",
     "fetchOffset.numRetries": "5", "groupIdPrefix": "cmp"},
    {"subscribePattern": "LAYOUTS"},  # the topic and its layout 1 (8 partitions)
]


def _rows(df):
    return sorted((r.topic, r.partition, r.offset, bytes(r.key), bytes(r.value),
                   r.timestamp, r.timestampType,
                   tuple((h.key, bytes(h.value)) for h in r.headers)) for r in df.collect())


@pytest.mark.parametrize("extra", COMPARED_OPTIONS, ids=["defaults", "offsets-json",
                                                          "min-partitions", "tuning", "pattern"])
def test_our_source_reads_what_sparks_kafka_source_reads_under_the_same_options(
        kafka_source, kafka_bootstrap, extra):
    spark = kafka_source
    topic = new_topic(kafka_bootstrap)
    sent = produce(kafka_bootstrap, topic, 400, int(time.time() * 1000))
    subscribe = {"subscribe": topic}
    if "subscribePattern" in extra:
        Admin({"bootstrap.servers": kafka_bootstrap}).create([TopicSpec(topic + ".l1", 8)])
        produce(kafka_bootstrap, topic + ".l1", 300, int(time.time() * 1000), tag="l1-")
        subscribe = {"subscribePattern": topic_pattern(topic)}
    counts = Counter(partition_for(q, 4) for q, _, _ in sent)
    # Partitions alternate: an offset inside it, or earliest (-2) / latest (-1).
    start = json.dumps({topic: {str(p): min(3, counts[p]) if p % 2 else -2 for p in range(4)}})
    end = json.dumps({topic: {str(p): min(30, counts[p]) if p % 2 == 0 else -1
                              for p in range(4)}})
    opts = {k: start if v == "PER_PARTITION_START" else end if v == "PER_PARTITION_END" else v
            for k, v in extra.items() if k != "subscribePattern"}
    frames = {}
    for fmt in ("kafka", "vqueues-kafka"):
        reader = (spark.read.format(fmt).option("kafka.bootstrap.servers", kafka_bootstrap)
                  .options(**subscribe).option("includeHeaders", "true"))
        for k, v in opts.items():
            reader = reader.option(k, v)
        frames[fmt] = reader.load()
    ours, theirs = frames["vqueues-kafka"], frames["kafka"]
    # Same columns and types (ours adds `queue`), same rows.
    assert ours.drop("queue").schema == theirs.schema
    rows = _rows(theirs)
    assert rows and _rows(ours) == rows
    if "subscribePattern" in subscribe:
        assert {r[0] for r in rows} == {topic, topic + ".l1"}
    if "minPartitions" in opts:
        assert ours.rdd.getNumPartitions() >= 7
        assert theirs.rdd.getNumPartitions() >= 7


def test_max_offsets_per_trigger_makes_the_same_micro_batches_as_sparks_source(
        kafka_source, kafka_bootstrap, tmp_path):
    spark = kafka_source
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, 1000, int(time.time() * 1000))
    sizes = {}
    for fmt in ("kafka", "vqueues-kafka"):
        query = (spark.readStream.format(fmt).option("kafka.bootstrap.servers", kafka_bootstrap)
                 .option("subscribe", topic).option("startingOffsets", "earliest")
                 .option("maxOffsetsPerTrigger", "300").load()
                 .writeStream.format("noop").trigger(availableNow=True)
                 .option("checkpointLocation", str(tmp_path / fmt)).start())
        query.awaitTermination()
        sizes[fmt] = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sum(sizes["kafka"]) == sum(sizes["vqueues-kafka"]) == 1000
    assert len(sizes["vqueues-kafka"]) == len(sizes["kafka"]) == 4
    assert max(sizes["vqueues-kafka"]) <= 300


@pytest.mark.parametrize("option", sorted(REFUSED))
def test_a_kafka_source_option_ours_cannot_honour_is_refused_by_name(
        kafka_source, kafka_bootstrap, option):
    spark = kafka_source
    topic = new_topic(kafka_bootstrap, partitions=1)
    values = {"assign": json.dumps({topic: [0]}),
              "startingtimestamp": "0", "startingoffsetsbytimestamp": json.dumps({topic: {"0": 0}}),
              "startingoffsetsbytimestampstrategy": "latest", "endingtimestamp": "1",
              "endingoffsetsbytimestamp": json.dumps({topic: {"0": 1}}),
              "minoffsetspertrigger": "10", "maxtriggerdelay": "1m",
              "maxrecordsperpartition": "10"}
    common = {"kafka.bootstrap.servers": kafka_bootstrap}
    if option != "assign":
        common["subscribe"] = topic
    # Spark's own source takes it (a real option of the Kafka source) ...
    streaming = option in ("minoffsetspertrigger", "maxtriggerdelay")
    read = spark.readStream if streaming else spark.read
    assert "value" in read.format("kafka").options(**common, **{option: values[option]}) \
        .load().columns
    # ... and ours refuses it by name instead of silently reading something else.
    with pytest.raises(Exception, match=option):
        read.format("vqueues-kafka").options(**common, **{option: values[option]}).load()


def test_every_option_of_sparks_kafka_source_is_taken_refused_or_ignored_on_purpose():
    """The docs' table is complete: each option the connector documents has a decision."""
    taken = {"kafka.bootstrap.servers", "subscribe", "subscribepattern", "startingoffsets",
             "endingoffsets", "failondataloss", "minpartitions", "maxoffsetspertrigger"}
    sparks = {"assign", "subscribe", "subscribepattern", "kafka.bootstrap.servers",
              "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsets",
              "endingtimestamp", "endingoffsetsbytimestamp", "endingoffsets", "failondataloss",
              "kafkaconsumer.polltimeoutms", "fetchoffset.numretries",
              "fetchoffset.retryintervalms", "maxoffsetspertrigger", "minoffsetspertrigger",
              "maxtriggerdelay", "minpartitions", "maxrecordsperpartition", "groupidprefix",
              "kafka.group.id", "includeheaders", "startingoffsetsbytimestampstrategy"}
    assert sparks == taken | REFUSED.keys() | IGNORED
    assert not (taken & REFUSED.keys()) and not (taken & IGNORED) and not (REFUSED.keys() & IGNORED)


# Growing by layouts (ADR 19): the data topic and `<topic>.l<n>` with more partitions.

BEFORE_LAYOUTS = Path(__file__).parent / "data" / "pipeline_checkpoint_before_layouts"


def queues_of(partitions, per=2):
    """`per` queue names routing to each of `partitions` partitions, by partition."""
    out: dict[int, list[str]] = {p: [] for p in range(partitions)}
    i = 0
    while any(len(qs) < per for qs in out.values()):
        q = f"growth/{i}"
        if len(out[partition_for(q, partitions)]) < per:
            out[partition_for(q, partitions)].append(q)
        i += 1
    return out


class Written:
    """Records produced at explicit partitions, with the offsets they got, in order."""

    def __init__(self, bootstrap):
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.records: list[dict[str, Any]] = []

    def send(self, topic, partition, key, value, headers=()):
        rec = {"topic": topic, "partition": partition, "queue": key, "value": value,
               "headers": tuple(headers)}
        self.records.append(rec)

        def delivered(err, msg):
            assert err is None, err
            rec["offset"] = msg.offset()

        self.producer.produce(topic, key=None if key is None else key.encode(), value=value,
                              partition=partition, headers=list(headers), on_delivery=delivered)
        return rec

    def queue(self, topic, partitions, queue, n):
        """`n` records of `queue`, to its partition of a topic with `partitions` partitions."""
        for _ in range(n):
            i = sum(1 for r in self.records if r["queue"] == queue)
            self.send(topic, partition_for(queue, partitions), queue, f"{queue}#{i}".encode())

    def flush(self):
        assert self.producer.flush(30) == 0
        assert all("offset" in r for r in self.records)


def is_original(rec):
    names = {k for k, _ in rec["headers"]}
    return FORWARDED_HEADER not in names and not (rec["queue"] is None and CUT_HEADER in names)


def grow(bootstrap, base, assignments, layout, old_partitions, partitions, w):
    """What `vqueues topics grow` does to the data topic: the layout's topic, then its layout
    record; and what the old layout's owners then do: a cut marker in each old partition."""
    Admin({"bootstrap.servers": bootstrap}).create([TopicSpec(topic_name(base, layout),
                                                              partitions)])
    key, value = encode_layout(Layout(layout, partitions), int(time.time() * 1000))
    w.producer.produce(assignments, key=key, value=value, partition=0)
    for p in range(old_partitions):
        w.send(topic_name(base, layout - 1), p, None, b"", [(CUT_HEADER, str(layout).encode())])


def late_and_forwarded(w, base, layout, old_partitions, new_partitions, queue):
    """A record of `queue` reaching its old partition after the cut, and the copy its old
    owner forwards to the new layout (with the idempotency key ADR 19 names)."""
    old = topic_name(base, layout - 1)
    p = partition_for(queue, old_partitions)
    i = sum(1 for r in w.records if r["queue"] == queue)
    late = w.send(old, p, queue, f"{queue}#{i}".encode())
    w.flush()
    where = f"l{layout - 1}:{p}:{late['offset']}".encode()
    w.send(topic_name(base, layout), partition_for(queue, new_partitions), queue, late["value"],
           [(FORWARDED_HEADER, where), ("vq-idempotency-key", b"vq-forwarded:" + where)])


def archive_rows(spark, out):
    rows = spark.read.parquet(str(out / "archive")).collect()
    return {(r.partition, r.offset): (r.queue, bytes(r.value),
                                      tuple((h.key, bytes(h.value)) for h in r.headers or ()))
            for r in rows}, len(rows)


def expected_rows(w, base, skip=lambda rec: False):
    return {(r["partition"], tag(layout_of_topic(r["topic"]), r["offset"])):
            (r["queue"], r["value"], r["headers"])
            for r in w.records if is_original(r) and not skip(r)}


def wait_archived(spark, query, out, n, timeout_s=180):
    deadline = time.monotonic() + timeout_s
    got = 0
    while time.monotonic() < deadline:
        assert query.exception() is None, query.exception()
        query.processAllAvailable()
        if (out / "archive").exists() and list((out / "archive").rglob("*.parquet")):
            got = spark.read.parquet(str(out / "archive")).count()
            if got >= n:
                return
        time.sleep(0.5)
    raise AssertionError(f"the archive holds {got} records, not {n}, after {timeout_s} s")


def check_archive(spark, out, expected):
    rows, count = archive_rows(spark, out)
    assert count == len(rows), "a record archived twice"
    assert rows == expected
    # Each queue's records, by offset, in the order they were written to it.
    by_queue: dict[str, list[tuple[int, bytes]]] = {}
    for (_, offset), (queue, value, _) in rows.items():
        if queue is not None:
            by_queue.setdefault(queue, []).append((offset, value))
    for queue, records in by_queue.items():
        values = [v for _, v in sorted(records)]
        assert values == sorted(values, key=lambda v: int(v.rsplit(b"#", 1)[1])), queue


def test_the_archive_resumes_a_checkpoint_from_before_layouts_and_follows_a_growth(
        spark, bootstrap, tmp_path):
    """Our source. The checkpoint in tests/data was written by the pipeline of commit 3d34acb
    (`subscribe` of one 4-partition topic; its offsets `{"0": 5, ...}`: 5 records of each
    partition read). Resumed by the pattern subscription, it goes on from offset 5; a layout
    created while the query runs is read from its first record; markers and forwarded copies
    are left out; offsets are tagged with their layout."""
    base, assignments = new_topic(bootstrap, 4), new_topic(bootstrap, 1)
    qs = queues_of(4)
    every = [q for p in sorted(qs) for q in qs[p]]
    w = Written(bootstrap)
    for p in range(4):
        for q in qs[p] * 3:  # 6 records in each partition, the first 5 read before
            w.queue(base, 4, q, 1)
    w.send(base, 3, None, b"keyless before")
    w.flush()
    shutil.copytree(BEFORE_LAYOUTS, tmp_path / "ckpt")
    (query,) = run(spark, options(bootstrap, base, tmp_path, jobs=("archive",),
                                  trigger="1 second"), wait=False)
    try:
        for q in every:
            w.queue(base, 4, q, 2)
        w.flush()
        out = tmp_path / "out"
        already = lambda r: r["topic"] == base and r["offset"] < 5  # noqa: E731
        wait_archived(spark, query, out, len(expected_rows(w, base, already)))
        # The growth, while the query runs: vq-data.l1 with 8 partitions.
        grow(bootstrap, base, assignments, 1, 4, 8, w)
        late_and_forwarded(w, base, 1, 4, 8, qs[0][0])
        for q in every:
            w.queue(topic_name(base, 1), 8, q, 3)
        w.send(topic_name(base, 1), 5, None, b"keyless after")
        w.flush()
        expected = expected_rows(w, base, already)
        wait_archived(spark, query, out, len(expected))
        query.processAllAvailable()
    finally:
        query.stop()
    check_archive(spark, out, expected)
    layouts = Counter(offset >> 48 for _, offset in expected)
    assert layouts == {0: 4 * 1 + 1 + 8 * 2 + 1, 1: 8 * 3 + 1}
    # The queue filter reads, in each layout's topic, the partition the queue had there.
    chosen = [qs[0][0], qs[1][0]]
    df = batch_reader(spark, bootstrap, None, subscribePattern=topic_pattern(base),
                      queues=json.dumps(chosen), assignmentTopic=assignments)
    rows = df.select("topic", "partition", "offset", "queue").collect()
    where = {(t, partition_for(q, n)) for q in chosen for t, n in
             ((base, 4), (topic_name(base, 1), 8))}
    assert {(r.topic, r.partition) for r in rows} == where
    assert df.rdd.getNumPartitions() == len(where)  # only those partitions are read
    assert sorted((r.topic, r.partition, r.offset) for r in rows) == sorted(
        (r["topic"], r["partition"], r["offset"]) for r in w.records if r["queue"] in chosen)


def test_deletion_markers_of_every_layout_hide_the_records_below_them(spark, bootstrap):
    """skipDeletedQueues after a growth: a deletion in layout 0 hides that queue's records
    below its floor there; one written after the growth (in `<offsets>.l1`, its floor a
    layout-1 offset) hides all of the queue's layout-0 records too."""
    from vqueues.records import QueueDeleted, encode_offset_entry

    base, assignments = new_topic(bootstrap, 4), new_topic(bootstrap, 1)
    offsets = new_topic(bootstrap, 4)
    Admin({"bootstrap.servers": bootstrap}).create([TopicSpec(topic_name(offsets, 1), 8)])
    w = Written(bootstrap)
    x, y, z = "deleted/after", "deleted/before", "kept"
    for q in (x, y, z):
        w.queue(base, 4, q, 3)
    w.flush()
    grow(bootstrap, base, assignments, 1, 4, 8, w)
    for q in (x, y, z):
        w.queue(topic_name(base, 1), 8, q, 3)
    w.flush()

    def nth(queue, layout, i):
        return [r for r in w.records if r["queue"] == queue
                and r["topic"] == topic_name(base, layout)][i]

    y_floor = nth(y, 0, 1)["offset"]
    x_floor = tag(1, nth(x, 1, 1)["offset"])
    for topic, partition, entry in (
            (offsets, partition_for(y, 4), QueueDeleted(y, y_floor)),
            (topic_name(offsets, 1), partition_for(x, 8), QueueDeleted(x, x_floor))):
        key, value = encode_offset_entry(entry)
        w.producer.produce(topic, key=key, value=value, partition=partition)
    w.flush()
    rows = batch_reader(spark, bootstrap, None, subscribePattern=topic_pattern(base),
                        skipDeletedQueues="true", deletionTopic=offsets,
                        assignmentTopic=assignments).collect()
    got = sorted((r.queue, bytes(r.value)) for r in rows if r.queue is not None)
    floors = {x: x_floor, y: y_floor}
    kept = sorted((r["queue"], r["value"]) for r in w.records if r["queue"] is not None
                  and tag(layout_of_topic(r["topic"]), r["offset"]) >= floors.get(r["queue"], 0))
    assert got == kept
    assert sum(1 for q, _ in got if q == x) == 2 and sum(1 for q, _ in got if q == y) == 5


def test_sparks_kafka_source_reads_every_new_layout_from_its_first_record(
        kafka_source, kafka_bootstrap, tmp_path):
    """Spark's own Kafka source (`--source kafka`), measured rather than assumed: a checkpoint
    it wrote under `subscribe` resumes under the pattern; a layout's topic the checkpoint does
    not know, created and written while the query was stopped, is read from its first record
    although startingOffsets is latest; one created while the query runs is read whole too.
    The jobs leave out markers and copies and tag offsets for this source as for ours."""
    from pyspark.sql import functions as F

    from vqueues.pipeline.jobs import _with_bucket, archive_query

    spark, boot = kafka_source, kafka_bootstrap
    base, assignments = new_topic(boot, 4), new_topic(boot, 1)
    qs = queues_of(4)
    every = [q for p in sorted(qs) for q in qs[p]]
    w = Written(boot)
    for q in every:
        w.queue(base, 4, q, 2)
    w.flush()
    opts = options(boot, base, tmp_path, jobs=("archive",), source="kafka",
                   starting_offsets="latest")
    # The archive job as it was before layouts: `subscribe` of the one topic.
    before = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", boot)
              .option("subscribe", base).option("startingOffsets", "earliest")
              .option("includeHeaders", "true").load()
              .withColumn("queue", F.col("key").cast("string")))
    archive_query(_with_bucket(before, opts.archive_buckets), opts).awaitTermination()
    out = tmp_path / "out"
    assert archive_rows(spark, out)[0] == expected_rows(w, base)
    # Layout 1 (8 partitions) while no query runs.
    grow(boot, base, assignments, 1, 4, 8, w)
    late_and_forwarded(w, base, 1, 4, 8, qs[1][0])
    for q in every:
        w.queue(topic_name(base, 1), 8, q, 2)
    w.flush()
    (query,) = run(spark, replace(opts, trigger="1 second"), wait=False)
    try:
        wait_archived(spark, query, out, len(expected_rows(w, base)))
        # Layout 2 (16 partitions) while it runs.
        grow(boot, base, assignments, 2, 8, 16, w)
        late_and_forwarded(w, base, 2, 8, 16, qs[2][0])
        for q in every:
            w.queue(topic_name(base, 2), 16, q, 2)
        w.flush()
        expected = expected_rows(w, base)
        wait_archived(spark, query, out, len(expected))
        query.processAllAvailable()
    finally:
        query.stop()
    check_archive(spark, out, expected)
    assert Counter(offset >> 48 for _, offset in expected) == {0: 8 * 2 + 1, 1: 8 * 2 + 1,
                                                               2: 8 * 2}
