#!/usr/bin/env python3
"""Live bytes per queue in one partition's index, without a broker: records are applied to a
PartitionState as the tail applies them, and tracemalloc counts what the state holds (queue
names are made before counting, so they are not in the figure; at 1M queues a name like
"queue-123456" is 61 B more). A second run counts what the allocators themselves hand out,
names included, as a node holds them: pymalloc's allocated blocks (`sys._debugmallocstats`)
plus glibc's bytes in use (`mallinfo2`), which includes each allocator's rounding that
tracemalloc does not see. With --baseline CHECKOUT, the same in an older checkout's package,
in the same run.

Usage: .venv/bin/python scripts/bench_index_memory.py [--queues 200000] [--records-per-queue 4]
       [--baseline /tmp/old]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def allocated() -> int:
    """Bytes the allocators have handed out: pymalloc's allocated blocks (printed by
    `sys._debugmallocstats` on the C stderr) plus glibc's in use."""
    from vqueues.memory import heap_in_use

    with tempfile.TemporaryFile() as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        text = f.read().decode()
    found = re.search(r"# bytes in allocated blocks\s*=\s*([\d,]+)", text)
    assert found, "no pymalloc statistics"
    return int(found.group(1).replace(",", "")) + heap_in_use()


def measure(queues: int, per_queue: int, allocator: bool) -> float:
    """Live bytes per queue: tracemalloc's count, names not included, or (allocator) the
    allocators' own, names included."""
    from vqueues.records import Record
    from vqueues.state.cache import RecordCache
    from vqueues.state.partition_state import PartitionState

    gc.collect()
    if allocator:
        before = allocated()
        names = [f"queue-{i}" for i in range(queues)]
    else:
        names = [f"queue-{i}" for i in range(queues)]
        tracemalloc.start()
    state = PartitionState(0, RecordCache(1024))  # a tiny cache: the index alone
    offset = 0
    batch: list[tuple[str, Record]] = []
    for _ in range(per_queue):
        for name in names:
            batch.append((name, Record(offset, 1, b"v", ())))
            offset += 1
            if len(batch) == 10_000:
                state.apply_records(batch, None)
                batch = []
    if batch:
        state.apply_records(batch, None)
    batch = []
    del names  # the index holds its own references to them
    gc.collect()
    if allocator:
        live = allocated() - before
    else:
        live, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert len(state.queues) == queues
    return live / queues


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=200_000)
    ap.add_argument("--records-per-queue", type=int, default=4)
    ap.add_argument("--baseline", metavar="CHECKOUT")
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.json:  # one measurement, in this interpreter's vqueues package
        print(json.dumps([measure(args.queues, args.records_per_queue, False),
                          measure(args.queues, args.records_per_queue, True)]))
        return
    rows: list[tuple[str, str, list[float]]] = []
    for label, root in (("baseline", args.baseline), ("this checkout", str(ROOT))):
        if root is None:
            continue
        # Its own interpreter, with `root` first on the path: that checkout's package.
        out = subprocess.run(
            [sys.executable, __file__, "--json", "--queues", str(args.queues),
             "--records-per-queue", str(args.records_per_queue)],
            env={**os.environ, "PYTHONPATH": root}, check=True, capture_output=True,
            text=True).stdout
        rows.append((label, root, json.loads(out)))
    print(f"| index, {args.queues:,} queues x {args.records_per_queue} records | live B per "
          "queue, tracemalloc (records included, names not) | the allocators' bytes in use per "
          "queue (records and names included) |")
    print("|---|---|---|")
    for label, root, (traced, held) in rows:
        print(f"| {label} ({root}) | {traced:.1f} | {held:.1f} |")


if __name__ == "__main__":
    main()
