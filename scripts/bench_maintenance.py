#!/usr/bin/env python3
"""Loop CPU of the retention pass (`Maintenance.follow_retention`) over one partition of
`--queues` queues, each with a record and a consumer (as a prefix consumer leaves every queue
it leased from), without a broker: the first pass and the next ones, in thread CPU time.

Usage: .venv/bin/python scripts/bench_maintenance.py [--queues 100000] [--passes 3]
Run with PYTHONPATH=<an older checkout> to measure that checkout's pass the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from vqueues.metrics import Metrics
from vqueues.records import ConsumerAcked, Record, now_ms
from vqueues.settings import Settings
from vqueues.state.cache import RecordCache
from vqueues.state.partition_state import PartitionState
from vqueues.upkeep.maintenance import Maintenance


class _Ownership:
    def __init__(self, state: PartitionState) -> None:
        self.states = {0: state}
        self.metrics = Metrics()


class _Service:
    async def log_start(self, partition: int) -> int:
        return 0

    async def expire_consumer(self, *args: object) -> int:
        return 0


async def main(args: argparse.Namespace) -> None:
    state = PartitionState(0, RecordCache(1 << 30))
    names = [f"tenant-{i}" for i in range(args.queues)]
    state.apply_records([(name, Record(i, 0, b"x" * 100, ())) for i, name in enumerate(names)],
                        None)
    now = now_ms()
    state.apply_offset_entries([ConsumerAcked(name, "pool", i + 1, now)
                                for i, name in enumerate(names)])
    state.ready.set()
    upkeep = Maintenance(Settings(), _Ownership(state), _Service())  # type: ignore[arg-type]
    for n in range(args.passes):
        started = time.thread_time()
        await upkeep.follow_retention()
        print(f"pass {n + 1}: {(time.thread_time() - started) * 1000:.0f} ms of loop CPU "
              f"({args.queues:,} queues with a consumer)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=100_000)
    ap.add_argument("--passes", type=int, default=3)
    asyncio.run(main(ap.parse_args()))
