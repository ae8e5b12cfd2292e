#!/usr/bin/env python3
"""Delete vqueues queues through the nodes that own them.

Usage: scripts/delete_queue.py --url http://node:8080 [--yes] [--dry-run] QUEUE [QUEUE ...]

The cluster map comes from any node given with --url (or VQ_URL); each queue is deleted on the
node that owns its partition. Each queue's record count and consumers are shown first, and the
deletion is confirmed unless --yes. Exit status: 0 when every queue was deleted (or, with
--dry-run, would be), 1 when any deletion failed or a queue was not found (unless
--ignore-missing), 2 for bad usage.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from vqueues_client import Client, VQError


def describe(info: dict) -> str:
    consumers = ", ".join(f"{c['consumer']}@{c['offset']} (lag {c['lag']})"
                          for c in info["consumers"]) or "none"
    return (f"partition {info['partition']}, {info['records']} record(s), "
            f"consumers: {consumers}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("queues", nargs="+", metavar="QUEUE")
    ap.add_argument("--url", action="append", default=None,
                    help="a node URL (repeatable) [env VQ_URL, comma-separated]")
    ap.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    ap.add_argument("--dry-run", action="store_true", help="show what would be deleted")
    ap.add_argument("--ignore-missing", action="store_true",
                    help="a queue that does not exist is not a failure")
    ap.add_argument("--deadline-s", type=float, default=30.0)
    args = ap.parse_args(argv)
    urls = args.url or [u for u in os.environ.get("VQ_URL", "").split(",") if u]
    if not urls:
        ap.error("give a node URL with --url or VQ_URL")

    failed = 0

    def attempt(q: str, call: Callable[[str], dict | None], failure: str, missing: str
                ) -> dict | None:
        """Run `call(q)`; report and count a failure or a missing queue."""
        nonlocal failed
        try:
            res = call(q)
        except VQError as exc:
            print(f"{q}: {failure}: {exc}")
            failed += 1
            return None
        if res is None:
            print(f"{q}: {missing}")
            failed += 0 if args.ignore_missing else 1
        return res

    with Client(urls, deadline_s=args.deadline_s) as vq:
        try:
            vq.cluster_map()
        except VQError as exc:
            print(f"cannot reach the cluster: {exc}", file=sys.stderr)
            return 1
        found: list[str] = []
        for q in args.queues:
            info = attempt(q, vq.queue_info, "FAILED to inspect", "not found")
            if info is not None:
                print(f"{q}: {describe(info)}")
                found.append(q)
        if args.dry_run:
            for q in found:
                print(f"{q}: would be deleted (dry run)")
            return 1 if failed else 0
        if found and not args.yes:
            if not sys.stdin.isatty():
                print("refusing to delete without --yes: standard input is not a terminal",
                      file=sys.stderr)
                return 1
            answer = input(f"Delete {len(found)} queue(s) and their consumers? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                print("nothing deleted")
                return 1
        for q in found:
            res = attempt(q, vq.delete_queue, "FAILED", "already gone")
            if res is not None:
                print(f"{q}: deleted ({res['records']} record(s), "
                      f"{len(res['consumers'])} consumer(s); records below offset "
                      f"{res['deleted_before']} are gone)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
