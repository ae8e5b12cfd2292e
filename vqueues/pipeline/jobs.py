"""The pipeline: archive every record and per-queue minute metrics from the data topic.

- archive: every record to Parquet under <output>/archive/date=<UTC date>/bucket=<b>/, with
  queue, partition, offset, timestamp, headers, key and value, sorted by queue and offset within
  a file (layout: vqueues/pipeline/layout.py), so data outlives the topic's retention;
- metrics: per queue and per minute of event time (the record timestamp), with a watermark, the
  record count and value bytes, to Parquet under <output>/metrics. A minute is written once the
  watermark passed its end (append mode): the newest minutes wait for later records.
Both are exactly-once into the file sinks through Spark checkpoints under <checkpoint>/.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vqueues.pipeline.layout import DEFAULT_BUCKETS, archive_bucket

log = logging.getLogger(__name__)

JOBS = ("archive", "metrics")


def read_queue(spark: Any, archive: str, queue: str, buckets: int = DEFAULT_BUCKETS) -> Any:
    """One queue's archived records, in (partition, offset) order: Spark reads only the
    queue's bucket directories (partition pruning) and, within their files, the row groups
    whose queue range holds it (the files are sorted by queue)."""
    from pyspark.sql import functions as F

    return (spark.read.parquet(archive)
            .where((F.col("bucket") == archive_bucket(queue, buckets))
                   & (F.col("queue") == queue))
            .orderBy("partition", "offset"))


def migrate_archive(spark: Any, old: str, new: str, buckets: int = DEFAULT_BUCKETS) -> int:
    """One-off: rewrite an archive of the old layout (queue=<escaped>/date=<d>/) into this one
    (date=<d>/bucket=<b>/). Spark reads the old directory names back unescaped; the old
    `__no_queue__` of keyless records becomes null. Returns the records written. Run it once,
    with no job writing to either path."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(old)
    df = df.withColumn("queue", F.when(F.col("queue") == "__no_queue__", F.lit(None))
                       .otherwise(F.col("queue"))).drop("date")
    (archive_frame(_with_bucket(df, buckets)).write.mode("errorifexists")
     .partitionBy("date", "bucket").parquet(new))
    return int(spark.read.parquet(new).count())


@dataclass(frozen=True)
class PipelineOptions:
    bootstrap: str
    output: str
    checkpoint: str
    topic: str = "vq-data"
    source: str = "vqueues"  # "vqueues" (ours) or "kafka" (Spark's connector, if installed)
    trigger: str = "available-now"  # or a processing-time interval such as "10 seconds"
    starting_offsets: str = "earliest"
    max_records_per_trigger: int | None = None
    watermark_delay: str = "1 minute"
    archive_buckets: int = DEFAULT_BUCKETS
    jobs: tuple[str, ...] = JOBS
    kafka_options: dict[str, str] = field(default_factory=dict)


def spark_session(master: str | None = None, app_name: str = "vqueues-pipeline") -> Any:
    """A SparkSession; a local master binds to loopback and uses this interpreter."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    if master is not None:
        builder = builder.master(master)
    if master is None or master.startswith("local"):
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1")
                   .config("spark.ui.enabled", "false")
                   .config("spark.ui.showConsoleProgress", "false")
                   .config("spark.sql.shuffle.partitions", "4"))
    spark = builder.getOrCreate()
    register(spark)
    return spark


def register(spark: Any) -> None:
    from vqueues.pipeline.source import VQueuesKafkaSource

    spark.dataSource.register(VQueuesKafkaSource)


def read_stream(spark: Any, opts: PipelineOptions, buckets: int | None = None) -> Any:
    """The data topic as a streaming DataFrame, through our source or Spark's Kafka source;
    with `buckets`, plus each record's archive bucket (column `bucket`)."""
    from pyspark.sql import functions as F

    fmt = {"vqueues": "vqueues-kafka", "kafka": "kafka"}[opts.source]
    reader = (spark.readStream.format(fmt)
              .option("kafka.bootstrap.servers", opts.bootstrap)
              .option("subscribe", opts.topic)
              .option("startingOffsets", opts.starting_offsets))
    if opts.max_records_per_trigger:
        reader = reader.option("maxOffsetsPerTrigger", str(opts.max_records_per_trigger))
    for k, v in opts.kafka_options.items():
        reader = reader.option(f"kafka.{k}", v)
    if opts.source == "kafka":
        reader = reader.option("includeHeaders", "true")
    elif buckets:
        reader = reader.option("queueBuckets", str(buckets))  # computed in our readers
    df = reader.load()
    if opts.source == "kafka":
        df = df.withColumn("queue", F.col("key").cast("string"))
        if buckets:
            df = _with_bucket(df, buckets)
    return df


def _with_bucket(df: Any, buckets: int) -> Any:
    """Add the archive bucket with mmh3 in a Python UDF, where our source cannot compute it in
    its readers (Spark's Kafka source, an old archive). Not Spark's own `hash()`: it is not
    standard Murmur3 for strings whose UTF-8 length is not a multiple of 4. (A vectorized UDF
    would need pandas, which the pipeline extra does not install.)"""
    from pyspark.sql import functions as F
    from pyspark.sql.types import IntegerType

    bucket = F.udf(lambda q: archive_bucket(q, buckets), IntegerType(), useArrow=False)
    return df.withColumn("bucket", bucket(F.col("queue")))


def _trigger(writer: Any, opts: PipelineOptions) -> Any:
    if opts.trigger == "available-now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=opts.trigger)


def archive_frame(df: Any) -> Any:
    """The archive's rows (a DataFrame with `bucket`), laid out for writing: one task per
    (date, bucket), sorted by queue, partition and offset within it, so a micro-batch writes at
    most one file per date and bucket whatever the number of queues."""
    from pyspark.sql import functions as F

    out = df.select(
        "queue", "bucket", F.date_format("timestamp", "yyyy-MM-dd").alias("date"),
        "partition", "offset", "timestamp", "headers", "key", "value")
    return (out.repartition("date", "bucket")
            .sortWithinPartitions("date", "bucket", "queue", "partition", "offset"))


def archive_query(df: Any, opts: PipelineOptions) -> Any:
    """The archive as a streaming query. A streaming DataFrame cannot be sorted, so each
    micro-batch is written as a batch (`foreachBatch`): laid out by `archive_frame` into a
    staging directory, then each file renamed to `date=<d>/bucket=<b>/part-<batch id>.parquet`.
    A micro-batch that runs again after a failure (same id, same records) writes the same names:
    exactly-once with the checkpoint, and no sink log is needed to read the archive."""
    archive = str(Path(opts.output) / "archive")

    def write_batch(batch: Any, batch_id: int) -> None:
        write_archive_batch(batch, archive, batch_id)

    writer = (df.writeStream.queryName("vqueues_archive").foreachBatch(write_batch)
              .option("checkpointLocation", str(Path(opts.checkpoint) / "archive")))
    return _trigger(writer, opts).start()


def write_archive_batch(batch: Any, archive: str, batch_id: int) -> int:
    """Write one micro-batch into the archive idempotently (see `archive_query`); returns the
    number of files written."""
    spark = batch.sparkSession
    staging = f"{archive}/_staging/{batch_id}"
    archive_frame(batch).write.mode("overwrite").partitionBy("date", "bucket").parquet(staging)
    jvm = spark._jvm
    hpath = jvm.org.apache.hadoop.fs.Path
    root = hpath(staging)
    fs = root.getFileSystem(spark._jsc.hadoopConfiguration())
    root_uri = fs.makeQualified(root).toUri().getPath().rstrip("/")
    found = fs.listFiles(root, True)
    files = []
    while found.hasNext():
        status = found.next()
        if status.getPath().getName().endswith(".parquet"):
            files.append(status.getPath())
    files.sort(key=lambda f: f.toUri().getPath())
    seen: dict[str, int] = {}
    for f in files:
        rel = f.getParent().toUri().getPath()[len(root_uri) + 1:]  # date=<d>/bucket=<b>
        k = seen[rel] = seen.get(rel, -1) + 1
        dest = hpath(f"{archive}/{rel}/part-{batch_id:010d}-{k:03d}.parquet")
        fs.mkdirs(dest.getParent())
        if fs.exists(dest):
            fs.delete(dest, False)  # the same batch written again: same records
        if not fs.rename(f, dest):
            raise RuntimeError(f"could not move {f} to {dest}")
    fs.delete(root, True)
    return len(files)


def metrics_query(df: Any, opts: PipelineOptions) -> Any:
    from pyspark.sql import functions as F

    out = (df.withWatermark("timestamp", opts.watermark_delay)
           .groupBy(F.window("timestamp", "1 minute"),
                    F.coalesce("queue", F.lit("__no_queue__")).alias("queue"))
           .agg(F.count(F.lit(1)).alias("records"),
                F.sum(F.coalesce(F.length("value"), F.lit(0))).alias("bytes"))
           .select("queue", F.col("window.start").alias("minute"), "records", "bytes"))
    writer = (out.writeStream.format("parquet").queryName("vqueues_metrics")
              .outputMode("append")
              .option("path", str(Path(opts.output) / "metrics"))
              .option("checkpointLocation", str(Path(opts.checkpoint) / "metrics")))
    return _trigger(writer, opts).start()


def run(spark: Any, opts: PipelineOptions, wait: bool = True) -> list[Any]:
    """Start the chosen jobs; with an available-now trigger (and `wait`), run them to the end."""
    unknown = set(opts.jobs) - set(JOBS)
    if unknown:
        raise ValueError(f"unknown jobs {sorted(unknown)}; choose from {JOBS}")
    queries = []
    if "archive" in opts.jobs:
        queries.append(archive_query(read_stream(spark, opts, opts.archive_buckets), opts))
    if "metrics" in opts.jobs:
        queries.append(metrics_query(read_stream(spark, opts), opts))
    log.info("pipeline_started", extra={"jobs": list(opts.jobs), "trigger": opts.trigger,
                                        "source": opts.source})
    if wait:
        for q in queries:
            q.awaitTermination()
            if q.exception() is not None:
                raise RuntimeError(f"query {q.name} failed: {q.exception()}")
    return queries
