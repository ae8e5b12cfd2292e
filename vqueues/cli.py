"""The `vqueues` command: serve, dev, kafka, topics create|grow, pipeline run, outbox install|relay
(vqueues/outbox/command.py), and the admin commands (queues, consumers, cluster: vqueues/admin.py).

The dev supervisor is in vqueues/dev.py."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

# numpy asks the kernel for transparent huge pages for every array of 4 MB or more; in a node
# those are a snapshot's short-lived temporaries, and a huge page the kernel must first compact
# memory for slows a takeover down (ADR 7). Databases (Redis, MongoDB) advise against THP for
# the same reason. Read at numpy's import:
# set before it; NUMPY_MADVISE_HUGEPAGE=1 in the environment keeps numpy's default.
os.environ.setdefault("NUMPY_MADVISE_HUGEPAGE", "0")

from vqueues import admin, logs, memory
from vqueues.errors import ConfigError, Unavailable
from vqueues.kafka import topics
from vqueues.outbox import command as outbox_command
from vqueues.settings import Settings

if TYPE_CHECKING:
    from vqueues.kafka.admin import Admin
    from vqueues.node import Node

log = logging.getLogger("vqueues.cli")


def _at_least_one(text: str) -> int:
    """An argparse type: a whole number of 1 or more (0 nodes or partitions cannot run)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The `vqueues` command line (also used to check the compose file's commands)."""
    parser = argparse.ArgumentParser(prog="vqueues", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a node against an existing Kafka/Redpanda")
    Settings.add_arguments(serve)

    dev = sub.add_parser("dev", help="the embedded broker (or --kafka) plus N nodes on loopback")
    dev.add_argument("--nodes", type=_at_least_one, default=1, help="number of nodes [default 1]")
    dev.add_argument("--partitions", type=_at_least_one, default=topics.DEFAULT_PARTITIONS,
                     help=f"data topic partitions [default {topics.DEFAULT_PARTITIONS}]")
    dev.add_argument("--http-port", type=int, default=8080,
                     help="first node's HTTP port; node i uses BASE+i [default 8080]")
    dev.add_argument("--broker-port", type=int, default=None,
                     help="embedded broker port [default: a free one]")
    dev.add_argument("--log-format", choices=("json", "text"), default="text")
    dev.add_argument("--kafka", action="store_true",
                     help="run on a local three-broker Apache Kafka cluster instead of the "
                     "embedded broker (needs Java 17+ and Maven)")

    kafka = sub.add_parser(
        "kafka", help="a local Apache Kafka cluster (KRaft) on loopback",
        description="Run a local Apache Kafka cluster (KRaft) on loopback until Ctrl-C. If any "
        "broker process exits, the others are stopped too and the command exits with status 1.")
    kafka.add_argument("--brokers", type=_at_least_one, default=3,
                       help="combined broker+controller processes [default 3]")
    kafka.add_argument("--folder", default=None,
                       help="an empty folder for the data and logs, kept after the stop "
                       "[default: a temporary one, removed]")
    kafka.add_argument("--fetch-only", action="store_true",
                       help="only fetch Kafka's jars into the cache and print where they are")

    tp = sub.add_parser("topics", help="topic administration")
    tsub = tp.add_subparsers(dest="topics_command", required=True)
    create = tsub.add_parser(
        "create", help="create the data, offset, assignment and snapshot topics",
        description="Create the data, offset, assignment and snapshot topics, and wait (up to "
        f"{topics.CREATE_WAIT_S:g} s) until the brokers list them. A compacted topic that "
        "exists already gets the compacted_* settings where its own differ; each change is "
        "printed. Exit status 3 if the topics do not match or do not appear.")
    create.add_argument("--partitions", type=_at_least_one, default=topics.DEFAULT_PARTITIONS)
    _add_topic_flags(create, replication_factor=-1, retention_ms=topics.DEFAULT_RETENTION_MS,
                     default="-1: the broker's default")
    grow = tsub.add_parser(
        "grow", help="grow the partition count by a new layout of the data, offset and "
        "snapshot topics (ADR 19)",
        description="Create the next layout's data, offset and snapshot topics with "
        "--partitions partitions (a multiple of the current layout's), wait (up to "
        f"{topics.CREATE_WAIT_S:g} s) until the brokers list them, then write the layout's "
        "record to the assignment topic. Nodes must follow layouts: see docs/growing.md. "
        "Exit status 2 if the growth is refused, 3 if the topics do not match, 1 if Kafka "
        "failed.")
    grow.add_argument("--partitions", type=_at_least_one, required=True,
                      help="the new layout's partition count")
    grow.add_argument("--dry-run", action="store_true",
                      help="print what would be done and change nothing")
    _add_topic_flags(grow, replication_factor=None, retention_ms=None,
                     default="from the current layout's data topic")
    pipe = sub.add_parser("pipeline", help="the Spark pipeline over the data topic")
    psub = pipe.add_subparsers(dest="pipeline_command", required=True)
    prun = psub.add_parser("run", help="archive records and per-queue metrics to Parquet")
    add_pipeline_arguments(prun)
    admin.add_commands(sub)
    outbox_command.add_commands(sub)
    return parser


def _add_topic_flags(p: argparse.ArgumentParser, replication_factor: int | None,
                     retention_ms: int | None, default: str) -> None:
    """The flags the `topics` commands share: where the brokers are, the topics' names and
    their configs (`default` says what the replication factor's default means)."""
    p.add_argument("--bootstrap", default=None, help="[env VQ_BOOTSTRAP]")
    p.add_argument("--replication-factor", type=int, default=replication_factor,
                   help=f"[default {default}]")
    p.add_argument("--retention-ms", type=int, default=retention_ms,
                   help=f"the data topic's retention.ms [default {retention_ms or default}]")
    for name in ("data_topic", "offset_topic", "assignment_topic", "snapshot_topic",
                 "compacted_segment_bytes", "compacted_segment_ms",
                 "compacted_delete_retention_ms", "kafka_options"):
        p.add_argument("--" + name.replace("_", "-"), dest=name, default=None,
                       help=f"[env VQ_{name.upper()}]")


def add_pipeline_arguments(p: argparse.ArgumentParser) -> None:
    """The pipeline's flags (shared with scripts/pipeline.py for spark-submit)."""
    p.add_argument("--bootstrap", default=os.environ.get("VQ_BOOTSTRAP"),
                   help="Kafka bootstrap servers [env VQ_BOOTSTRAP]")
    p.add_argument("--topic", default=os.environ.get("VQ_DATA_TOPIC", "vq-data"),
                   help="the data topic, read with its layouts' topics <topic>.l<n> "
                        "[env VQ_DATA_TOPIC; default vq-data]")
    p.add_argument("--output", required=True, help="directory for archive/ and metrics/")
    p.add_argument("--checkpoint", required=True, help="directory for the Spark checkpoints")
    p.add_argument("--source", choices=("vqueues", "kafka"), default="vqueues",
                   help="vqueues: our Python source (default); kafka: Spark's Kafka connector "
                        "(a local master fetches it with Maven; spark-submit needs --packages)")
    p.add_argument("--trigger", default="available-now",
                   help="available-now (default: process what is there, then stop) or a "
                        "processing-time interval such as '30 seconds'")
    p.add_argument("--starting-offsets", default="earliest",
                   help='earliest (default), latest or {"<topic>": {"0": offset}}')
    p.add_argument("--max-records-per-trigger", type=int, default=None)
    p.add_argument("--watermark-delay", default="1 minute",
                   help="how late a record may arrive and still count in its minute")
    p.add_argument("--jobs", default="archive,metrics", help="archive, metrics or both")
    p.add_argument("--archive-buckets", type=int, default=64,
                   help="archive buckets per date (mmh3 of the queue name; default 64)")
    p.add_argument("--archive-writers", type=int, default=None,
                   help="archive writer tasks per micro-batch (default: Spark's default "
                        "parallelism); a micro-batch writes at most this many files per date "
                        "and bucket")
    p.add_argument("--master", default=None,
                   help="Spark master (default: local[*], or spark-submit's)")
    p.add_argument("--kafka-option", action="append", default=[], metavar="KEY=VALUE",
                   help="Kafka client setting for the source, e.g. security.protocol=SSL")


def run_pipeline(args: argparse.Namespace, master_default: str | None = "local[*]") -> int:
    from vqueues.kafka.maven import JarsUnavailable
    from vqueues.pipeline.jobs import PipelineOptions, run, spark_kafka_jars, spark_session

    if not args.bootstrap:
        print("vqueues pipeline: --bootstrap (or VQ_BOOTSTRAP) is required", file=sys.stderr)
        return 2
    kafka_options = dict(kv.split("=", 1) for kv in args.kafka_option)
    opts = PipelineOptions(
        bootstrap=args.bootstrap, output=args.output, checkpoint=args.checkpoint,
        topic=args.topic, source=args.source, trigger=args.trigger,
        starting_offsets=args.starting_offsets,
        max_records_per_trigger=args.max_records_per_trigger,
        watermark_delay=args.watermark_delay, archive_buckets=args.archive_buckets,
        archive_writers=args.archive_writers,
        jobs=tuple(j.strip() for j in args.jobs.split(",") if j.strip()),
        kafka_options=kafka_options)
    master = args.master or master_default
    jars: list[str] = []
    if args.source == "kafka" and master and master.startswith("local"):
        # A local Spark gets the connector from Maven; spark-submit takes --packages instead.
        try:
            jars = spark_kafka_jars()
        except JarsUnavailable as exc:
            print(f"vqueues pipeline: --source kafka: {exc}", file=sys.stderr)
            return 3
    spark = spark_session(master, jars=jars)
    try:
        run(spark, opts)
    finally:
        spark.stop()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "dev":
        return _dev(args)
    if args.command == "kafka":
        return _kafka(args)
    if args.command == "pipeline":
        logs.setup("info", "text")
        return run_pipeline(args)
    if args.command == "outbox":
        return outbox_command.run(args)
    if args.command in ("queues", "consumers", "cluster"):
        return admin.run(args)
    if args.topics_command == "grow":
        return _topics_grow(args)
    return _topics_create(args)


async def _started(node: Node, stop: asyncio.Event) -> bool:
    """Start the node; False if the process was asked to stop before it had started (while
    it waited for its topics, say: that wait ends at once)."""
    starting = asyncio.create_task(node.start())
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait([starting, stopping], return_when=asyncio.FIRST_COMPLETED)
    stopping.cancel()
    if stop.is_set():
        node.abandoned.set()
        with contextlib.suppress(ConfigError):  # the topics it gave up waiting for
            await starting
        return False
    await starting  # its error, if it failed
    return True


def _serve(args: argparse.Namespace) -> int:
    from vqueues.node import Node  # heavy imports only for the command that needs them

    try:
        settings = Settings.load(args)
        settings.ssl_context()  # a bad certificate or key stops the node here, plainly
    except (ValueError, OSError) as exc:  # ssl.SSLError is an OSError
        print(f"vqueues: {exc}", file=sys.stderr)
        return 2
    logs.setup(settings.log_level, settings.log_format)
    memory.limit_arenas(settings.malloc_arena_max)  # before any thread allocates

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        carried = None
        restarts = 0
        while True:
            node = Node(settings, carried)
            try:
                if not await _started(node, stop):
                    log.info("node_stopping", extra={"node": settings.effective_node_id,
                                                     "restart": False})
                    await node.stop()
                    return 0
            except ConfigError as exc:
                log.error("topic_check_failed", extra={"error": str(exc)})
                print(f"vqueues: {exc}", file=sys.stderr)
                await node.stop()
                return 3
            except Exception:
                if not restarts:
                    raise  # a first start that fails says so, as before
                # A restart on a new layout that fails (the broker away a moment): again.
                log.exception("node_restart_failed", extra={"attempt": restarts})
                await node.stop()
                carried = None  # stopped with the node (it was attached) or left unused
                restarts += 1
                await asyncio.sleep(min(5.0, 0.5 * restarts))
                continue
            stopping = asyncio.create_task(stop.wait())
            restarting = asyncio.create_task(node.restart.wait())
            await asyncio.wait([stopping, restarting], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            restarting.cancel()
            log.info("node_stopping", extra={"node": settings.effective_node_id,
                                             "restart": not stop.is_set()})
            carried = None if stop.is_set() else node.take_next()
            await node.stop()
            del node
            # The stopped node was frozen out of the collector at its start (gc.freeze):
            # unfreeze, so that its cache and clients are freed before the next one starts.
            gc.unfreeze()
            gc.collect()
            if stop.is_set():
                if carried is not None:
                    await asyncio.to_thread(carried.stop)
                return 0
            restarts += 1

    if settings.event_loop == "uvloop":
        try:
            import uvloop
        except ImportError:
            log.warning("uvloop_missing", extra={"using": "asyncio"})
        else:
            return uvloop.run(run())
    return asyncio.run(run())


def _topic_admin(args: argparse.Namespace) -> tuple[Settings, Admin, dict[str, Any]]:
    """The settings, an admin client and the client config of a `topics` command."""
    from vqueues.kafka import client_config
    from vqueues.kafka.admin import Admin

    settings = Settings.load(args)
    logs.setup(settings.log_level, "text")
    conf = client_config(settings.bootstrap, settings.kafka_extra())
    return settings, Admin(conf), conf


def _topics_create(args: argparse.Namespace) -> int:
    settings, admin, _ = _topic_admin(args)
    outcome = topics.create(admin, topics.specs(
        settings.data_topic, settings.offset_topic, settings.assignment_topic,
        args.partitions, args.retention_ms, args.replication_factor, settings.snapshot_topic,
        compaction=topics.compaction_config(settings)))
    for name, what in outcome.items():
        print(f"{name}: {what}")
    wait = topics.CREATE_WAIT_S
    try:
        partitions = topics.check(admin, settings.data_topic, settings.offset_topic,
                                  settings.assignment_topic, wait_s=wait)
        if settings.snapshot_topic and not topics.check_snapshots(
                admin, settings.snapshot_topic, partitions, wait_s=wait):
            raise ConfigError(f"topic {settings.snapshot_topic!r} does not exist (not in the "
                              f"brokers' metadata after waiting {wait:g} s)")
    except ConfigError as exc:
        print(f"vqueues: {exc}", file=sys.stderr)
        return 3
    return 0


def _topics_grow(args: argparse.Namespace) -> int:
    from vqueues.kafka.logs import RecordTopic

    settings, admin, conf = _topic_admin(args)
    try:
        print(topics.grow(admin, RecordTopic(conf, settings.assignment_topic), settings,
                          args.partitions, replication_factor=args.replication_factor,
                          retention_ms=args.retention_ms, dry_run=args.dry_run,
                          now_ms=time.time_ns() // 1_000_000))
    except (topics.GrowthRefused, ConfigError, Unavailable) as exc:
        print(f"vqueues topics grow: {exc}", file=sys.stderr)
        # Unavailable: Kafka failed (unreachable, timed out); a re-run reuses what was made.
        return (2 if isinstance(exc, topics.GrowthRefused) else
                3 if isinstance(exc, ConfigError) else 1)
    return 0


def _dev(args: argparse.Namespace) -> int:
    from vqueues.dev import run_dev
    from vqueues.kafka.maven import JarsUnavailable

    logs.setup("info", args.log_format)
    try:
        return run_dev(nodes=args.nodes, partitions=args.partitions, http_port=args.http_port,
                       broker_port=args.broker_port, log_format=args.log_format,
                       kafka=args.kafka)
    except JarsUnavailable as exc:
        print(f"vqueues: {exc}", file=sys.stderr)
        return 3


def _kafka(args: argparse.Namespace) -> int:
    """Run a local Kafka cluster until SIGINT/SIGTERM, then stop every process it started."""
    from vqueues.kafka.local_cluster import KAFKA_VERSION, POM, LocalKafkaCluster
    from vqueues.kafka.maven import JarsUnavailable, fetch_jars
    logs.setup("info", "text")
    try:
        if args.fetch_only:
            print(fetch_jars(POM), flush=True)
            return 0
        stopping = threading.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stopping.set())
        folder = Path(args.folder) if args.folder else None
        with LocalKafkaCluster(args.brokers, folder=folder) as cluster:
            print(f"Apache Kafka {KAFKA_VERSION}: {cluster.size} brokers at {cluster.bootstrap}",
                  f"  data in {cluster.folder}", "Press Ctrl-C to stop.", sep="\n", flush=True)
            while not stopping.wait(0.5):
                if not all(p.running for p in cluster.processes):
                    print("vqueues: a Kafka process exited; stopping", file=sys.stderr)
                    return 1
        return 0
    except JarsUnavailable as exc:
        print(f"vqueues: {exc}", file=sys.stderr)
        return 3
