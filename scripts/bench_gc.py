#!/usr/bin/env python3
"""Garbage-collection pauses while a node's index grows by queues created after its start (no
broker): records of new queues are applied to a PartitionState in batches of 1000, as the tail
applies them, with the node's collector settings (young threshold 20,000, what exists at start
frozen), beside a few short-lived objects per batch, as requests make. Each collection is timed
by a `gc.callbacks` hook. Run twice in fresh interpreters: without, and with
a `memory.Freezer` checked every --check-every queues (a node checks every second).

Usage: .venv/bin/python scripts/bench_gc.py [--queues 5000000] [--check-every 10000]
       [--limit 50000]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def measure(queues: int, check_every: int, limit: int) -> dict[str, float]:
    sys.path.insert(0, str(ROOT))
    from vqueues import memory
    from vqueues.records import Record
    from vqueues.state.cache import RecordCache
    from vqueues.state.partition_state import PartitionState

    pauses: list[tuple[float, int]] = []
    started = [0.0]

    def timed(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - started[0], int(info["generation"])))

    gc.set_threshold(20_000, *gc.get_threshold()[1:])
    gc.freeze()
    gc.callbacks.append(timed)
    state = PartitionState(0, RecordCache(0))
    freezer = memory.Freezer(limit)
    batch: list[tuple[str, Record]] = []
    freezes, checking = 0, 0.0
    for i in range(queues):
        batch.append((f"queue-{i:07}", Record(i, 1, b"v", ())))
        if len(batch) == 1000:
            state.apply_records(batch, None)
            batch = []
            _requests = [[j] for j in range(50)]  # short-lived and tracked, as a request makes
        if check_every and i % check_every == 0:
            t = time.perf_counter()
            freezes += bool(freezer.check())
            checking += time.perf_counter() - t
    full = [p for p, g in pauses if g == 2]
    return {"collections": len(pauses), "full": len(full),
            "max_full_ms": max(full, default=0.0) * 1e3,
            "max_ms": max((p for p, _ in pauses), default=0.0) * 1e3,
            "all_ms": sum(p for p, _ in pauses) * 1e3, "freezes": freezes,
            "checking_ms": checking * 1e3}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=5_000_000)
    ap.add_argument("--check-every", type=int, default=10_000)
    ap.add_argument("--limit", type=int, default=50_000, help="gc_freeze_objects")
    ap.add_argument("--json", type=int, metavar="CHECK_EVERY", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json is not None:
        print(json.dumps(measure(args.queues, args.json, args.limit)))
        return
    print(f"| {args.queues:,} queues created after the start | collections (full) | longest "
          "full | longest any | all collections | freezes (their checks' time) |")
    print("|---|---|---|---|---|---|")
    for check_every in (0, args.check_every):
        out = subprocess.run([sys.executable, __file__, "--queues", str(args.queues),
                              "--limit", str(args.limit), "--json", str(check_every)],
                             check=True, capture_output=True, text=True).stdout
        r = json.loads(out)
        label = (f"memory.Freezer({args.limit:,}), checked every {check_every:,} queues"
                 if check_every else "never frozen")
        print(f"| {label} | {r['collections']} ({r['full']}) | {r['max_full_ms']:.1f} ms | "
              f"{r['max_ms']:.1f} ms | {r['all_ms']:.0f} ms | {r['freezes']} "
              f"({r['checking_ms']:.0f} ms) |")


if __name__ == "__main__":
    main()
