"""`vqueues outbox install|relay` (docs/outbox.md). psycopg (the `outbox` extra) is imported
only when one of them runs."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from typing import Any

from vqueues import logs
from vqueues.outbox.relay import Relay, RelayMetrics, RelayOptions

log = logging.getLogger("vqueues.outbox")


def add_commands(sub: Any) -> None:
    """Add `outbox install` and `outbox relay` to the `vqueues` command's subparsers."""
    outbox = sub.add_parser("outbox", help="the transactional outbox for PostgreSQL")
    osub = outbox.add_subparsers(dest="outbox_command", required=True)
    dsn = argparse.ArgumentParser(add_help=False)
    dsn.add_argument("--dsn", default="",
                     help="libpq connection string or URI [default: libpq's PG* environment "
                          "variables]")
    osub.add_parser("install", parents=[dsn],
                    help="create the outbox's schema, tables and triggers (idempotent)")
    r = osub.add_parser("relay", parents=[dsn],
                        help="move committed outbox rows to their queues until SIGTERM")
    d = RelayOptions(dsn="", urls=[])
    r.add_argument("--url", action="append", default=None,
                   help="a node URL, repeatable [env VQ_URL, comma-separated; default "
                        "http://127.0.0.1:8080]")
    r.add_argument("--token", default=None, help="bearer token [env VQ_TOKEN]")
    r.add_argument("--batch-records", type=int, default=d.batch_records,
                   help=f"rows per send, at most the node's max_batch_records "
                        f"[default {d.batch_records}]")
    r.add_argument("--poll-ms", type=int, default=d.poll_ms,
                   help=f"look for rows (and free buckets) at least this often without a "
                        f"notification [default {d.poll_ms}]")
    r.add_argument("--deadline-ms", type=int, default=d.deadline_ms,
                   help=f"give up a send (retries included) after this long [default "
                        f"{d.deadline_ms}]")
    r.add_argument("--settle-ms", type=int, default=d.settle_ms,
                   help=f"how long after a send started its records may still be written "
                        f"(the deadline plus the node's broker_timeout_ms and "
                        f"write_visible_timeout_ms, with room): a queue whose send did not "
                        f"settle is read back only after this [default {d.settle_ms}]")
    r.add_argument("--backoff-max-ms", type=int, default=d.backoff_max_ms,
                   help=f"longest wait after failures [default {d.backoff_max_ms}]")
    r.add_argument("--metrics-port", type=int, default=None,
                   help="serve Prometheus metrics at http://HOST:PORT/metrics [default: none]")
    r.add_argument("--metrics-host", default="127.0.0.1",
                   help="address the metrics are served on [default 127.0.0.1]")
    r.add_argument("--log-format", choices=("json", "text"), default="json")
    r.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    if args.outbox_command == "install":
        logs.setup("info", "text")
        return _install(args)
    logs.setup(args.log_level, args.log_format)
    urls = args.url or [u for u in os.environ.get("VQ_URL", "").split(",") if u] or [
        "http://127.0.0.1:8080"]
    options = RelayOptions(
        dsn=args.dsn, urls=urls, token=args.token or os.environ.get("VQ_TOKEN") or None,
        batch_records=args.batch_records, poll_ms=args.poll_ms, deadline_ms=args.deadline_ms,
        settle_ms=args.settle_ms, backoff_max_ms=args.backoff_max_ms)
    return asyncio.run(_relay(options, args.metrics_host, args.metrics_port))


def _install(args: argparse.Namespace) -> int:
    import psycopg

    from vqueues.outbox.schema import install

    try:
        with psycopg.connect(args.dsn) as conn:
            namespace = install(conn)
    except psycopg.Error as exc:
        print(f"vqueues outbox install: {exc}", file=sys.stderr)
        return 1
    print(f"outbox installed (schema vqueues_outbox, namespace {namespace})")
    return 0


async def _relay(options: RelayOptions, metrics_host: str, metrics_port: int | None) -> int:
    from aiohttp import web
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    metrics = RelayMetrics()
    runner: web.AppRunner | None = None
    if metrics_port is not None:
        async def serve_metrics(_: web.Request) -> web.Response:
            return web.Response(body=generate_latest(metrics.registry),
                                headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", serve_metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, metrics_host, metrics_port).start()
    log.info("outbox_relay_started", extra={"urls": options.urls})
    try:
        await Relay(options, metrics).run(stop)
    finally:
        if runner is not None:
            await runner.cleanup()
    log.info("outbox_relay_stopped")
    return 0
