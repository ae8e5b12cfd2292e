"""The pipeline: archive every record and per-queue minute metrics from the data topic.

The data topic is read with every layout's (ADR 19: `vq-data`, `vq-data.l1`, ...), by pattern,
so a layout created while a query runs is read from its first record; each record is counted
once, from the topic it was written to (`queue_records`).

- archive: every record to Parquet under <output>/archive/date=<UTC date>/bucket=<b>/, with
  queue, partition, offset (the vqueues offset), timestamp, headers, key and value, sorted by
  queue and offset within a file (layout: vqueues/pipeline/layout.py), so data outlives the
  topic's retention;
- metrics: per queue and per minute of event time (the record timestamp), with a watermark, the
  record count and value bytes, to Parquet under <output>/metrics. A minute is written once the
  watermark passed its end (append mode): the newest minutes wait for later records.
Both are exactly-once into the file sinks through Spark checkpoints under <checkpoint>/.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vqueues.layouts import topic_pattern
from vqueues.pipeline.layout import DEFAULT_BUCKETS, archive_bucket

log = logging.getLogger(__name__)

JOBS = ("archive", "metrics")


def read_queue(spark: Any, archive: str, queue: str, buckets: int = DEFAULT_BUCKETS) -> Any:
    """One queue's archived records, in offset order (its order: offsets are vqueues offsets,
    which a later layout's exceed): Spark reads only the queue's bucket directories (partition
    pruning) and, within their files, the row groups whose queue range holds it (the files are
    sorted by queue)."""
    from pyspark.sql import functions as F

    return (spark.read.parquet(archive)
            .where((F.col("bucket") == archive_bucket(queue, buckets))
                   & (F.col("queue") == queue))
            .orderBy("offset", "partition"))


def migrate_archive(spark: Any, old: str, new: str, buckets: int = DEFAULT_BUCKETS,
                    writers: int | None = None) -> int:
    """One-off: rewrite an archive of the old layout (queue=<escaped>/date=<d>/) into this one
    (date=<d>/bucket=<b>/) with the archive's sink. Spark reads the old directory names back
    unescaped; the old `__no_queue__` of keyless records becomes null. Returns the records
    written. Run it once, with no job writing to either path; `new` must not hold files."""
    from pyspark.sql import functions as F

    from vqueues.pipeline.archive import holds_files

    if holds_files(new):
        raise FileExistsError(f"{new} already holds files: migrate into an empty directory")
    df = spark.read.parquet(old)
    df = df.withColumn("queue", F.when(F.col("queue") == "__no_queue__", F.lit(None))
                       .otherwise(F.col("queue"))).drop("date")
    n = writers or spark.sparkContext.defaultParallelism
    (_with_bucket(df, buckets).coalesce(n).write.format("vqueues-archive").mode("append")
     .option("path", new).save())
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
    archive_writers: int | None = None  # writer tasks per micro-batch (None: default parallelism)
    jobs: tuple[str, ...] = JOBS
    kafka_options: dict[str, str] = field(default_factory=dict)


SPARK_KAFKA_POM = Path(__file__).with_name("spark-kafka.pom.xml")


def spark_kafka_jars() -> list[str]:
    """Spark's Kafka connector and what it needs beyond pyspark, fetched by Maven on first use
    (raises `vqueues.kafka.maven.JarsUnavailable` without Java or Maven)."""
    from vqueues.kafka.maven import fetch_jars

    return sorted(str(p) for p in fetch_jars(SPARK_KAFKA_POM).glob("*.jar"))


def spark_session(master: str | None = None, app_name: str = "vqueues-pipeline",
                  jars: Sequence[str] = ()) -> Any:
    """A SparkSession; a local master binds to loopback and uses this interpreter. `jars` go
    on its classpath (`spark.jars`), e.g. `spark_kafka_jars()` for Spark's Kafka source."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).config("spark.sql.session.timeZone", "UTC")
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
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
    from vqueues.pipeline.archive import ArchiveSink
    from vqueues.pipeline.source import VQueuesKafkaSource

    spark.dataSource.register(VQueuesKafkaSource)
    spark.dataSource.register(ArchiveSink)


def read_stream(spark: Any, opts: PipelineOptions, buckets: int | None = None) -> Any:
    """The data topic and its layouts' as a streaming DataFrame of queue records
    (`queue_records`), through our source or Spark's Kafka source; with `buckets`, plus each
    record's archive bucket (column `bucket`)."""
    from pyspark.sql import functions as F

    fmt = {"vqueues": "vqueues-kafka", "kafka": "kafka"}[opts.source]
    reader = (spark.readStream.format(fmt)
              .option("kafka.bootstrap.servers", opts.bootstrap)
              .option("subscribePattern", topic_pattern(opts.topic))
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
    df = queue_records(df, opts.topic)
    if opts.source == "kafka" and buckets:
        df = _with_bucket(df, buckets)
    return df


def queue_records(df: Any, topic: str) -> Any:
    """Records read from `topic` and its layouts' topics (ADR 19) as vqueues numbers them:
    without the cut markers (keyless, header `vq-layout-cut`) and the forwarded copies (header
    `vq-forwarded-from`; the original is read from the topic it was written to), and with
    `offset` the vqueues offset, the Kafka offset tagged with its topic's layout (layout 0's
    unchanged). Spark expressions, so the same for either source."""
    from pyspark.sql import functions as F

    from vqueues.layouts import CUT_HEADER, FORWARDED_HEADER, TAG_BITS

    def has(header: str) -> Any:
        return F.coalesce(F.array_contains(F.col("headers.key"), header), F.lit(False))

    copy = (F.col("key").isNull() & has(CUT_HEADER)) | has(FORWARDED_HEADER)
    # The topics read are `topic` and `topic.l<n>` (topic_pattern): n follows the ".l".
    layout = (F.when(F.col("topic") == topic, F.lit(0).cast("long"))
              .otherwise(F.expr(f"substring(topic, {len(topic) + 3})").cast("long")))
    return (df.where(~copy)
            .withColumn("offset", F.shiftleft(layout, TAG_BITS).bitwiseOR(F.col("offset"))))


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


def archive_query(df: Any, opts: PipelineOptions) -> Any:
    """The archive as a streaming query into our sink (`vqueues-archive`,
    vqueues/pipeline/archive.py): `archive_writers` tasks (default: Spark's default
    parallelism), no shuffle, each sorting and writing with pyarrow. The sink's commit names
    the files after the batch id, so a micro-batch that runs again after a failure writes the
    same names: exactly-once with the checkpoint, and no sink log is needed to read the
    archive."""
    archive = str(Path(opts.output) / "archive")
    writers = opts.archive_writers or df.sparkSession.sparkContext.defaultParallelism
    writer = (df.coalesce(writers).writeStream.queryName("vqueues_archive")
              .format("vqueues-archive").option("path", archive)
              .option("checkpointLocation", str(Path(opts.checkpoint) / "archive")))
    return _trigger(writer, opts).start()


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
    if opts.archive_writers is not None and opts.archive_writers < 1:
        raise ValueError("archive_writers must be at least 1")
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
