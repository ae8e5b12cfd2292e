"""The admin CLI: `vqueues queues|consumers|cluster` (docs/admin-cli.md).

It talks to any node over HTTP through the Python client, which routes each queue's call to
the node that owns its partition. Tables for people, `--json` for scripts; long work shows a
progress bar (on standard error, when it is a terminal, or with `--progress`); destroying asks
first unless `--yes`.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from vqueues_client import AsyncClient

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_commands(sub: Any) -> None:
    """Add `queues`, `consumers` and `cluster` to the `vqueues` command's subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", action="append", default=None,
                        help="a node URL, repeatable [env VQ_URL, comma-separated; default "
                             "http://127.0.0.1:8080]")
    common.add_argument("--token", default=None, help="bearer token [env VQ_TOKEN]")
    common.add_argument("--ca-file", default=None,
                        help="PEM CA bundle for https:// nodes [env VQ_CA_FILE]")
    common.add_argument("--json", action="store_true", help="JSON on standard output")
    common.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on standard error [default: when it is a terminal]")
    common.add_argument("--deadline-s", type=float, default=30.0,
                        help="give up a call after this long [default 30]")
    destroy = argparse.ArgumentParser(add_help=False)
    destroy.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    destroy.add_argument("--dry-run", action="store_true", help="show what would be done")

    queues = sub.add_parser("queues", help="list, inspect, delete and tail queues")
    qs = queues.add_subparsers(dest="admin_command", required=True)
    p = qs.add_parser("list", parents=[common], help="queues across the cluster, with depth "
                      "and the worst consumer lag")
    p.add_argument("--prefix", default="", help="only names starting with this")
    p.add_argument("--limit", type=int, default=None, help="at most this many")
    p = qs.add_parser("stats", parents=[common], help="a queue's records, offsets, consumers")
    p.add_argument("queues", nargs="+", metavar="QUEUE")
    p = qs.add_parser("delete", parents=[common, destroy],
                      help="delete queues and their consumers (asks first unless --yes)")
    p.add_argument("queues", nargs="*", metavar="QUEUE")
    p.add_argument("--prefix", default=None, help="delete every queue whose name starts with "
                   "this (listed first)")
    p.add_argument("--ignore-missing", action="store_true",
                   help="a queue that does not exist is not a failure")
    p = qs.add_parser("tail", parents=[common], help="print a queue's records as they arrive")
    p.add_argument("queue", metavar="QUEUE")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--offset", type=int, default=None, help="start at this offset")
    where.add_argument("--from-start", action="store_true",
                       help="start at the first retained record (default: the end)")
    where.add_argument("--consumer", default=None,
                       help="start at this consumer's committed offset (nothing is acked)")
    p.add_argument("--count", "-n", type=int, default=None, help="stop after this many records")
    p.add_argument("--no-follow", action="store_true",
                   help="stop at the queue's end instead of waiting for more")

    consumers = sub.add_parser("consumers", help="list, reset and delete a queue's consumers")
    cs = consumers.add_subparsers(dest="admin_command", required=True)
    p = cs.add_parser("list", parents=[common], help="a queue's consumers: mode, offset, lag")
    p.add_argument("queue", metavar="QUEUE")
    p = cs.add_parser("reset", parents=[common, destroy],
                      help="move a cursor consumer's committed offset (rewind or skip)")
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("consumer", metavar="CONSUMER")
    to = p.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-offset", type=int, help="this offset (the next record read)")
    to.add_argument("--to-time", help="the first record at or after this time: ISO 8601 "
                    "(2026-11-22T10:00:00Z) or epoch milliseconds")
    to.add_argument("--to-earliest", action="store_true", help="the first retained record")
    to.add_argument("--to-latest", action="store_true", help="the queue's end (skip all)")
    to.add_argument("--shift-by", type=int, help="this many records forward (or back, < 0)")
    p = cs.add_parser("delete", parents=[common, destroy], help="delete a consumer")
    p.add_argument("queue", metavar="QUEUE")
    p.add_argument("consumer", metavar="CONSUMER")
    cs.add_parser("prefixes", parents=[common], help="prefix consumers across the cluster: "
                  "queues, backlog, in flight")

    sub.add_parser("cluster", parents=[common], help="the cluster map: nodes, partitions, "
                   "owners, readiness and replay progress")


def run(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None,
        stdin: TextIO | None = None) -> int:
    """Run an admin command; returns the exit status."""
    cli = Admin(args, out or sys.stdout, err or sys.stderr, stdin or sys.stdin)
    return asyncio.run(cli.main())


def _parse_time(text: str) -> int:
    if text.isdigit():
        return int(text)
    stamp = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=datetime.UTC)
    return int(stamp.timestamp() * 1000)


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def _describe(info: dict[str, Any]) -> str:
    consumers = ", ".join(f"{c['consumer']}@{c['offset']} (lag {c['lag']})"
                          for c in info["consumers"]) or "none"
    return (f"partition {info['partition']}, {info['records']} record(s), "
            f"consumers: {consumers}")


class Admin:
    """One admin command's run: the client, the output, the questions."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO
                 ) -> None:
        self.args = args
        self.out = Console(file=out, soft_wrap=True, highlight=False)
        self.err = Console(file=err, stderr=True, highlight=False)
        self.stdin = stdin
        progress = args.progress
        self.show_progress = err.isatty() if progress is None else progress

    async def main(self) -> int:
        from vqueues_client import AsyncClient, VQError

        urls = self.args.url or [u for u in os.environ.get("VQ_URL", "").split(",") if u]
        token = self.args.token or os.environ.get("VQ_TOKEN") or None
        ca_file = self.args.ca_file or os.environ.get("VQ_CA_FILE") or None
        command = self.args.command + (f" {self.args.admin_command}"
                                       if self.args.command != "cluster" else "")
        handlers: dict[str, Callable[[AsyncClient], Awaitable[int]]] = {
            "queues list": self.queues_list, "queues stats": self.queues_stats,
            "queues delete": self.queues_delete, "queues tail": self.queues_tail,
            "consumers list": self.consumers_list, "consumers reset": self.consumers_reset,
            "consumers delete": self.consumers_delete,
            "consumers prefixes": self.consumers_prefixes, "cluster": self.cluster}
        async with AsyncClient(urls or ["http://127.0.0.1:8080"], token=token,
                               ca_file=ca_file, deadline_s=self.args.deadline_s) as vq:
            try:
                return await handlers[command](vq)
            except VQError as exc:
                self.err.print(f"vqueues {command}: {exc}", markup=False)
                return EXIT_FAILED
            except KeyboardInterrupt:
                return EXIT_FAILED

    # Output ------------------------------------------------------------------------------------

    def emit_json(self, value: Any) -> None:
        self.out.file.write(json.dumps(value, indent=2, sort_keys=True) + "\n")

    def table(self, columns: Sequence[str], rows: Iterable[Sequence[Any]],
              title: str | None = None) -> None:
        t = Table(*columns, title=title, box=None, header_style="bold", pad_edge=False)
        for row in rows:
            t.add_row(*("-" if v is None else str(v) for v in row))
        self.out.print(t)

    def say(self, text: str) -> None:
        self.out.print(text, markup=False)

    def progress(self, what: str) -> Progress:
        return Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=self.err, disable=not self.show_progress)

    def confirm(self, verb: str, question: str) -> bool:
        """Ask unless --yes; refuse when nobody can answer (standard input not a terminal)."""
        if self.args.yes:
            return True
        if not self.stdin.isatty():
            self.err.print(f"refusing to {verb} without --yes: standard input is not a "
                           "terminal", markup=False)
            return False
        self.err.print(f"{question} [y/N] ", end="", markup=False)
        return self.stdin.readline().strip().lower() in ("y", "yes")

    # queues ------------------------------------------------------------------------------------

    async def queues_list(self, vq: AsyncClient) -> int:
        rows = await vq.list_queues(self.args.prefix, limit=self.args.limit, stats=True)
        if self.args.json:
            self.emit_json(rows)
            return EXIT_OK
        self.table(("QUEUE", "PARTITION", "RECORDS", "FIRST", "LAST", "CONSUMERS", "MAX LAG"),
                   ((r["queue"], r["partition"], r["records"], r["first_offset"],
                     r["last_offset"], r["consumers"], r["max_lag"]) for r in rows))
        self.err.print(f"{len(rows)} queue(s)", markup=False)
        return EXIT_OK

    async def queues_stats(self, vq: AsyncClient) -> int:
        infos, missing = [], []
        for q in self.args.queues:
            info = await vq.queue_info(q)
            (infos.append(info) if info is not None else missing.append(q))
        if self.args.json:
            self.emit_json({"queues": infos, "missing": missing})
        else:
            for info in infos:
                self.say(f"{info['queue']}: partition {info['partition']}, {info['records']} "
                         f"record(s), offsets {info['first_offset']}..{info['last_offset']}, "
                         f"{info['scheduled']} scheduled")
                self._consumer_table(info)
            for q in missing:
                self.err.print(f"{q}: not found", markup=False)
        return EXIT_FAILED if missing else EXIT_OK

    async def queues_delete(self, vq: AsyncClient) -> int:
        from vqueues_client import VQError

        names = list(dict.fromkeys(self.args.queues))
        if self.args.prefix is not None:
            if self.args.prefix == "" and not self.args.yes:
                self.err.print("--prefix '' would delete every queue: give --yes to mean it",
                               markup=False)
                return EXIT_USAGE
            names += [q for q in await vq.list_queues(self.args.prefix) if q not in names]
        if not names:
            self.err.print("nothing to delete: give queue names or --prefix", markup=False)
            return EXIT_USAGE if self.args.prefix is None else EXIT_OK
        failed = 0
        found: list[dict[str, Any]] = []
        for q in names:
            info = await vq.queue_info(q)
            if info is None:
                self.say(f"{q}: not found")
                failed += 0 if self.args.ignore_missing else 1
            else:
                found.append(info)
                self.say(f"{q}: {_describe(info)}")
        if self.args.dry_run:
            for info in found:
                self.say(f"{info['queue']}: would be deleted (dry run)")
            return EXIT_FAILED if failed else EXIT_OK
        if found and not self.confirm("delete", f"Delete {len(found)} queue(s) and their "
                                      "consumers?"):
            self.err.print("nothing deleted", markup=False)
            return EXIT_FAILED
        deleted: list[dict[str, Any]] = []
        with self.progress("deleting") as bar:
            task = bar.add_task("deleting", total=len(found))
            for info in found:
                try:
                    res = await vq.delete_queue(info["queue"])
                except VQError as exc:
                    self.say(f"{info['queue']}: FAILED: {exc}")
                    failed += 1
                else:
                    if res is None:
                        self.say(f"{info['queue']}: already gone")
                        failed += 0 if self.args.ignore_missing else 1
                    else:
                        deleted.append(res)
                bar.advance(task)
        for res in deleted:
            self.say(f"{res['queue']}: deleted ({res['records']} record(s), "
                     f"{len(res['consumers'])} consumer(s); records below offset "
                     f"{res['deleted_before']} are gone)")
        return EXIT_FAILED if failed else EXIT_OK

    async def queues_tail(self, vq: AsyncClient) -> int:
        a = self.args
        q = a.queue
        if a.offset is not None:
            offset: int | None = a.offset
        elif a.from_start:
            offset = 0
        elif a.consumer is not None:
            info = await vq.queue_info(q)
            known = {c["consumer"]: c["offset"] for c in (info or {}).get("consumers", [])}
            if a.consumer not in known:
                self.err.print(f"{q}: no consumer {a.consumer!r}", markup=False)
                return EXIT_FAILED
            offset = known[a.consumer]
        else:
            info = await vq.queue_info(q)
            offset = (info["last_offset"] + 1 if info and info["last_offset"] is not None
                      else 0)
        seen = 0
        with self.progress("tailing") as bar:
            task = bar.add_task("tailing", total=a.count)
            while a.count is None or seen < a.count:
                limit = min(1000, a.count - seen) if a.count is not None else 1000
                page = await vq.read(q, offset=offset, limit=limit,
                                     wait_ms=0 if a.no_follow else 5000)
                for r in page.records[:limit]:
                    self._print_record(r)
                    seen += 1
                    bar.advance(task)
                offset = page.next_offset
                if a.no_follow and not page.records:
                    break
        return EXIT_OK

    def _print_record(self, r: Any) -> None:
        text = r.value.decode("utf-8", "replace") if r.value is not None else None
        if self.args.json:
            line = json.dumps({"offset": r.offset, "timestamp": r.timestamp, "value": text,
                               "headers": r.headers})
            self.out.file.write(line + "\n")
            self.out.file.flush()
        else:
            # Tab-separated for cut/awk (written plainly: rich would expand the tabs).
            self.out.file.write(f"{r.offset}\t{_when(r.timestamp)}\t{text}\n")
            self.out.file.flush()

    # consumers ---------------------------------------------------------------------------------

    def _consumer_table(self, info: dict[str, Any]) -> None:
        self.table(("CONSUMER", "MODE", "OFFSET", "LAG", "IN FLIGHT", "DELAYED", "AVAILABLE",
                    "DEAD LETTERED"),
                   ((c["consumer"], c["mode"], c["offset"], c["lag"], c["in_flight"],
                     c["delayed"], c["available"], c["dead_lettered"])
                    for c in info["consumers"]))

    async def _info(self, vq: AsyncClient, queue: str) -> dict[str, Any] | None:
        info = await vq.queue_info(queue)
        if info is None:
            self.err.print(f"{queue}: not found", markup=False)
        return info

    async def consumers_list(self, vq: AsyncClient) -> int:
        info = await self._info(vq, self.args.queue)
        if info is None:
            return EXIT_FAILED
        if self.args.json:
            self.emit_json(info["consumers"])
        else:
            self._consumer_table(info)
        return EXIT_OK

    async def consumers_prefixes(self, vq: AsyncClient) -> int:
        rows = await vq.prefix_consumers()
        if self.args.json:
            self.emit_json(rows)
            return EXIT_OK
        self.table(("CONSUMER", "PREFIX", "QUEUES", "WAITING", "BACKLOG", "IN FLIGHT",
                    "MAX IN FLIGHT", "ATTEMPTS", "DEAD LETTERS"),
                   [(r["consumer"], r["prefix"], r["queues"], r["ready_queues"], r["backlog"],
                     r["in_flight"], r["max_in_flight"], r["max_attempts"],
                     r["dead_letter_queue"]) for r in rows])
        return EXIT_OK

    async def consumers_reset(self, vq: AsyncClient) -> int:
        a = self.args
        info = await self._info(vq, a.queue)
        if info is None:
            return EXIT_FAILED
        current = next((c for c in info["consumers"] if c["consumer"] == a.consumer), None)
        first = info["first_offset"]
        end = info["last_offset"] + 1 if info["last_offset"] is not None else 0
        if a.to_offset is not None:
            target = a.to_offset
        elif a.to_earliest:
            target = first if first is not None else 0
        elif a.to_latest:
            target = end
        elif a.to_time is not None:
            try:
                at = _parse_time(a.to_time)
            except ValueError:
                self.err.print(f"--to-time {a.to_time!r} is not ISO 8601 or epoch ms",
                               markup=False)
                return EXIT_USAGE
            target = await vq.find_offset(a.queue, at) if first is not None else 0
        else:
            if current is None:
                self.err.print(f"{a.queue}: no consumer {a.consumer!r} to shift", markup=False)
                return EXIT_FAILED
            target = await self._shift(vq, a.queue, current["offset"], a.shift_by, first, end)
        before = current["offset"] if current else None
        plan = {"queue": a.queue, "consumer": a.consumer, "from": before, "to": target}
        if not a.json:
            self.say(f"{a.queue} / {a.consumer}: offset {before if before is not None else '-'}"
                     f" -> {target}" + (" (dry run)" if a.dry_run else ""))
        if a.dry_run:
            if a.json:
                self.emit_json(plan)
            return EXIT_OK
        question = f"Move consumer {a.consumer!r} of {a.queue!r} to offset {target}?"
        if not self.confirm("reset", question):
            self.err.print("nothing changed", markup=False)
            return EXIT_FAILED
        res = await vq.ack(a.queue, a.consumer, target, allow_rewind=True)
        if a.json:
            self.emit_json({**plan, "result": res})
        else:
            self.say(f"{a.queue} / {a.consumer}: committed offset {res.get('offset', target)}")
        return EXIT_OK

    async def _shift(self, vq: AsyncClient, queue: str, offset: int, by: int,
                     first: int | None, end: int) -> int:
        """The offset `by` records after (or before) `offset`, within the queue's records."""
        if by >= 0:
            page = await vq.read(queue, offset=offset, limit=min(by, 1000) or 1)
            if by == 0:
                return offset
            return page.next_offset if len(page.records) <= by else page.records[by].offset
        start = max(first or 0, 0)
        # Walk forward from the first record, keeping the last |by|+1 offsets below `offset`.
        window: list[int] = []
        cursor = start
        while cursor < offset:
            page = await vq.read(queue, offset=cursor, limit=1000)
            window += [r.offset for r in page.records if r.offset < offset]
            window = window[by:] if len(window) > -by else window
            if not page.records or page.records[-1].offset >= offset:
                break
            cursor = page.next_offset
        return window[0] if len(window) >= -by else start

    async def consumers_delete(self, vq: AsyncClient) -> int:
        a = self.args
        if a.dry_run:
            self.say(f"{a.queue} / {a.consumer}: would be deleted (dry run)")
            return EXIT_OK
        if not self.confirm("delete", f"Delete consumer {a.consumer!r} of {a.queue!r}?"):
            self.err.print("nothing deleted", markup=False)
            return EXIT_FAILED
        res = await vq.delete_consumer(a.queue, a.consumer)
        if res is None:
            self.err.print(f"{a.queue}: no consumer {a.consumer!r}", markup=False)
            return EXIT_FAILED
        if a.json:
            self.emit_json(res)
        else:
            self.say(f"{a.queue} / {a.consumer}: deleted")
        return EXIT_OK

    # cluster -----------------------------------------------------------------------------------

    async def cluster(self, vq: AsyncClient) -> int:
        cmap = await vq.cluster_map()
        nodes = await vq.nodes()
        if self.args.json:
            self.emit_json({"map": cmap, "nodes": nodes})
            return EXIT_OK
        self.say(f"{cmap['partitions']} partition(s), generation {cmap['generation']}")
        self.table(("NODE", "URL", "STATUS", "OWNED", "READY"),
                   ((n.get("node", "?"), n["url"], n.get("status", n.get("error")),
                     len(n.get("owned", [])), len(n.get("ready", []))) for n in nodes),
                   title="nodes")
        details = {d["partition"]: (n, d) for n in nodes for d in n.get("details", [])}
        rows = []
        for p in range(int(cmap["partitions"])):
            owner = cmap["owners"].get(str(p))
            n, d = details.get(p, (None, None))
            if d is None:
                rows.append((p, owner["node"] if owner else "-", "-", "-", "-", "-", "-"))
                continue
            target = d["replay_target"]
            if d["ready"]:
                replay = "done"
            elif target is not None and target > d["log_start"]:
                done = (d["next_offset"] - d["log_start"]) / (target - d["log_start"])
                replay = f"{min(100.0, max(0.0, 100.0 * done)):.0f}%"
            else:
                replay = "starting"
            rows.append((p, n.get("node", "?") if n else "-", "yes" if d["ready"] else "no",
                         d["queues"], d["next_offset"] - d["log_start"], d["next_offset"],
                         replay))
        self.table(("PARTITION", "OWNER", "READY", "QUEUES", "RECORDS", "END", "REPLAY"), rows,
                   title="partitions")
        unready = sum(1 for r in rows if r[2] != "yes")
        return EXIT_FAILED if unready else EXIT_OK
