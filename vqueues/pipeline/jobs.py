"""The pipeline: archive every record and per-queue minute metrics from the data topic.

- archive: every record to Parquet under <output>/archive, partitioned by queue and date (UTC),
  with partition, offset, timestamp, headers, key and value, so data outlives the topic's
  retention;
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

log = logging.getLogger(__name__)

JOBS = ("archive", "metrics")


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


def read_stream(spark: Any, opts: PipelineOptions) -> Any:
    """The data topic as a streaming DataFrame, through our source or Spark's Kafka source."""
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
    df = reader.load()
    if opts.source == "kafka":
        df = df.withColumn("queue", F.col("key").cast("string"))
    return df


def _trigger(writer: Any, opts: PipelineOptions) -> Any:
    if opts.trigger == "available-now":
        return writer.trigger(availableNow=True)
    return writer.trigger(processingTime=opts.trigger)


def archive_query(df: Any, opts: PipelineOptions) -> Any:
    from pyspark.sql import functions as F

    out = df.select(
        F.coalesce("queue", F.lit("__no_queue__")).alias("queue"),
        F.date_format("timestamp", "yyyy-MM-dd").alias("date"),
        "partition", "offset", "timestamp", "headers", "key", "value")
    # One task per queue directory: a file per queue and batch, not one per queue and task.
    out = out.repartition("queue")
    writer = (out.writeStream.format("parquet").queryName("vqueues_archive")
              .partitionBy("queue", "date")
              .option("path", str(Path(opts.output) / "archive"))
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
    queries = []
    if "archive" in opts.jobs:
        queries.append(archive_query(read_stream(spark, opts), opts))
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
