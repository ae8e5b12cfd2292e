#!/usr/bin/env python3
"""The idempotency model test, longer: random keyed enqueues against the model of the documented
rule, over more seeds and steps than the suite runs. Both tiers: the in-memory one (snapshots
and new owners through the unit tier's logs) and the real one (two node processes on the
embedded broker, snapshots every second, SIGTERM restarts and takeovers).

Usage: .venv/bin/python scripts/idempotency_model.py [--seeds 0-9] [--steps 300]
       [--unit-steps 2000] [--tier both|unit|nodes]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def seeds(text: str) -> list[int]:
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0-9", help="seeds: 0-9 or 1,5,7")
    ap.add_argument("--steps", type=int, default=300, help="steps per seed on real nodes")
    ap.add_argument("--unit-steps", type=int, default=2000, help="steps per seed in memory")
    ap.add_argument("--tier", choices=("both", "unit", "nodes"), default="both")
    args = ap.parse_args()
    chosen = ",".join(map(str, seeds(args.seeds)))
    env = {**os.environ, "VQ_IDEMPOTENCY_MODEL_SEEDS": chosen,
           "VQ_IDEMPOTENCY_MODEL_STEPS": str(args.steps),
           "VQ_IDEMPOTENCY_MODEL_UNIT_STEPS": str(args.unit_steps)}
    tests = []
    if args.tier in ("both", "unit"):
        tests.append("tests/unit/queues/test_idempotency_model.py")
    if args.tier in ("both", "nodes"):
        tests.append("tests/test_idempotency_model.py")
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider",
                            *tests], cwd=ROOT, env=env)


if __name__ == "__main__":
    sys.exit(main())
