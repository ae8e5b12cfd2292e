#!/usr/bin/env python3
"""Records per second through the vqueues Spark source into the Parquet archive, against a plain
confluent-kafka consumer reading the same records, in one run on the same broker.

With --broker kafka the run is on a local three-broker Apache Kafka cluster, and Spark's own
Kafka source (spark-sql-kafka-0-10, fetched by Maven) reads the same topic into the same archive
as a row beside ours. (On the embedded broker Spark's source reads wrong end offsets: ADR 3.)

Usage: .venv/bin/python scripts/bench_pipeline.py [--records 2000000] [--partitions 16]
       [--queues 1000,1000000] [--broker kafka]

Every streaming query pays a fixed start-up of about 2 s on these machines (Spark starts Python
runners for the source and the sink), whatever its size; 2,000,000 records per topic make the
whole-query figure the steady rate rather than that constant (`--records 500000` shows it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from vqueues.kafka.admin import Admin, TopicSpec  # noqa: E402
from vqueues.kafka.broker import EmbeddedBroker  # noqa: E402
from vqueues.kafka.local_cluster import KAFKA_VERSION, LocalKafkaCluster  # noqa: E402
from vqueues.pipeline.jobs import (  # noqa: E402
    PipelineOptions,
    read_stream,
    run,
    spark_kafka_jars,
    spark_session,
)


def fill(bootstrap: str, topic: str, count: int, queues: int) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2", "linger.ms": 20,
                  "batch.num.messages": 10000, "queue.buffering.max.messages": 1000000})
    keys = [f"queue-{i}".encode() for i in range(queues)]
    value = b"x" * 100
    for i in range(count):
        while True:
            try:
                p.produce(topic, key=keys[i % queues], value=value, headers=[("h", b"v")])
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)


def plain_read(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.partition.eof": True, "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    # It stops at the last record (it knows how many there are) rather than at every
    # partition's EOF, which can wait a fetch.wait.max.ms: the fastest a plain reader can be.
    t0, n, eof = time.perf_counter(), 0, set[int]()
    while n < count and len(eof) < partitions:
        for m in c.consume(10000, 0.5):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition() or 0)
                continue
            n += 1
    elapsed = time.perf_counter() - t0
    c.close()
    assert n == count, (n, count)
    return n / elapsed


def timed(spark: Any, opts: PipelineOptions, sink: str | None) -> tuple[float, float]:
    """Run one availableNow query; (wall seconds, seconds spent executing its batches)."""
    t0 = time.perf_counter()
    if sink == "noop":
        query = (read_stream(spark, opts).writeStream.format("noop")
                 .option("checkpointLocation", opts.checkpoint).trigger(availableNow=True)
                 .start())
        query.awaitTermination()
    else:
        (query,) = run(spark, opts)
    wall = time.perf_counter() - t0
    batch = sum(p["durationMs"].get("addBatch", 0) for p in query.recentProgress) / 1000
    return wall, max(batch, 1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--queues", default="1000,1000000",
                    help="comma-separated queue counts, each a topic of --records records")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--broker", choices=("embedded", "kafka"), default="embedded",
                    help="kafka: a local three-broker Apache Kafka cluster, and Spark's own "
                    "Kafka source beside ours (needs Java and Maven)")
    args = ap.parse_args()
    counts = [int(x) for x in args.queues.split(",")]
    kafka = args.broker == "kafka"
    broker: EmbeddedBroker | LocalKafkaCluster = (
        LocalKafkaCluster() if kafka else EmbeddedBroker()).start()
    results = []
    try:
        admin = Admin({"bootstrap.servers": broker.bootstrap})
        spark = spark_session(args.master, jars=spark_kafka_jars() if kafka else ())
        spark.sparkContext.setLogLevel("ERROR")
        with tempfile.TemporaryDirectory() as tmp:
            # Warm the JVM and the Python workers on a small topic first: the first query of a
            # session pays ~7 s of start-up that is not the source's speed.
            warm = f"benchpipe-{uuid.uuid4().hex[:6]}-warm"
            admin.create([TopicSpec(warm, 2)])
            fill(broker.bootstrap, warm, 10_000, 10)
            timed(spark, PipelineOptions(bootstrap=broker.bootstrap, topic=warm,
                                         output=f"{tmp}/warm", checkpoint=f"{tmp}/ckpt-warm",
                                         jobs=("archive",)), None)
            if kafka:
                timed(spark, PipelineOptions(bootstrap=broker.bootstrap, topic=warm,
                                             source="kafka", output=f"{tmp}/kwarm",
                                             checkpoint=f"{tmp}/kckpt-warm",
                                             jobs=("archive",)), None)
            for queues in counts:
                topic = f"benchpipe-{uuid.uuid4().hex[:6]}"
                admin.create([TopicSpec(topic, args.partitions)])
                fill(broker.bootstrap, topic, args.records, queues)
                raw = plain_read(broker.bootstrap, topic, args.partitions, args.records)
                source = timed(spark, PipelineOptions(
                    bootstrap=broker.bootstrap, topic=topic, output=f"{tmp}/none-{queues}",
                    checkpoint=f"{tmp}/ckpt-noop-{queues}"), "noop")
                archive = timed(spark, PipelineOptions(
                    bootstrap=broker.bootstrap, topic=topic, output=f"{tmp}/out-{queues}",
                    checkpoint=f"{tmp}/ckpt-{queues}", jobs=("archive",)), None)
                archived = spark.read.parquet(f"{tmp}/out-{queues}/archive").count()
                files = len(list(Path(f"{tmp}/out-{queues}/archive").rglob("*.parquet")))
                assert archived == args.records, (archived, args.records)
                theirs: list[tuple[str, tuple[float, float]]] = []
                if kafka:
                    theirs.append(("Spark's Kafka source -> no-op sink", timed(
                        spark, PipelineOptions(
                            bootstrap=broker.bootstrap, topic=topic, source="kafka",
                            output=f"{tmp}/knone-{queues}",
                            checkpoint=f"{tmp}/kckpt-noop-{queues}"), "noop")))
                    out = f"{tmp}/kout-{queues}"
                    wall_batch = timed(spark, PipelineOptions(
                        bootstrap=broker.bootstrap, topic=topic, source="kafka", output=out,
                        checkpoint=f"{tmp}/kckpt-{queues}", jobs=("archive",)), None)
                    assert spark.read.parquet(f"{out}/archive").count() == args.records
                    kfiles = len(list(Path(f"{out}/archive").rglob("*.parquet")))
                    theirs.append((f"Spark's Kafka source -> Parquet archive ({kfiles} files; "
                                   "bucket by a Python UDF)", wall_batch))
                # The plain consumer again, after Spark: the faster of its two reads counts.
                raw = max(raw, plain_read(broker.bootstrap, topic, args.partitions, args.records))
                results.append((queues, raw, source, archive, files, theirs))
        spark.stop()
    finally:
        broker.stop()
    n = args.records
    print(f"# vqueues pipeline bench, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: "
          f"{n:,} records of 100 B per topic, {args.partitions} partitions, Spark {args.master}, "
          + (f"Apache Kafka {KAFKA_VERSION}, 3 brokers (replication 3)" if kafka
             else "embedded broker") + ", archive layout date/bucket (64 buckets)")
    print("| queues | path | records/s, whole query | ratio | records/s, batch execution | "
          "ratio |")
    print("|---|---|---|---|---|---|")
    for queues, raw, source, archive, files, theirs in results:
        print(f"| {queues:,} | plain confluent-kafka consumer, 1 thread (read only; the faster "
              f"of a read before and one after) | {raw:,.0f} "
              "| 1.00 | | |")
        for label, (wall, batch) in (("vqueues source -> no-op sink", source),
                                     (f"vqueues source -> Parquet archive ({files} files)",
                                      archive), *theirs):
            print(f"| {queues:,} | {label} | {n / wall:,.0f} | {n / wall / raw:.2f} | "
                  f"{n / batch:,.0f} | {n / batch / raw:.2f} |")
    print("(whole query: availableNow from start to termination, warm session; batch "
          "execution: the micro-batches' addBatch time)")


if __name__ == "__main__":
    main()
