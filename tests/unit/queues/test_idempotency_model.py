"""Idempotent enqueue against a model of the documented rule (docs/api.md), through the in-memory
logs: random keyed requests (plain, scheduled by `deliver_at` or `delay_ms`, repeats within and
across requests, other payloads), snapshots and new owners (from the latest snapshot or by
replay) at random points. Every key maps to exactly one record, every refusal is
`409 idempotency_key_reused` naming what it should, and nothing else is written.

The same model runs against real node processes in tests/test_idempotency_model.py."""

import os
import random
import time

import pytest

from tests.keyed_model import KeyModel, Requests
from tests.narrow import known
from tests.unit.fakes import MemoryLog
from tests.unit.nodes import Owner
from vqueues.api import enqueue_body
from vqueues.settings import Settings
from vqueues.state.idempotency import KEY_HEADER

pytestmark = pytest.mark.unit
PARTITIONS = 2


async def run_model(seed: int, steps: int, monkeypatch) -> dict[str, int]:
    rng = random.Random(seed)
    clock = [int(time.time() * 1000)]
    monkeypatch.setattr(enqueue_body, "now_ms", lambda: clock[0])  # due times pass between retries
    logs = (MemoryLog(), MemoryLog(), MemoryLog())
    logs[0].timestamp = clock[0]  # records written now, inside the window
    settings = Settings(write_visible_timeout_ms=1000)
    owner = await Owner(logs, settings).start()
    model, requests = KeyModel(PARTITIONS), Requests(rng, lambda: clock[0])
    counts = {"requests": 0, "refused": 0, "snapshots": 0, "new owners": 0}
    try:
        for _ in range(steps):
            clock[0] += rng.choice([0, 10, 60])
            roll = rng.random()
            if roll < 0.08:
                await owner.snapshot()
                counts["snapshots"] += 1
            elif roll < 0.16:
                owner.close()
                owner = await Owner(logs, settings).start()
                counts["new owners"] += 1
            else:
                queue, records = requests.next()
                answer = await owner.send(queue, records)
                model.check(queue, records, answer)
                counts["requests"] += 1
                counts["refused"] += "error" in answer
    finally:
        owner.close()
    # Every key maps to exactly one record, and nothing else was written.
    written: dict[tuple[str, str], list[int]] = {}
    for log in logs[0].partitions.values():
        for offset, (k, _, headers) in enumerate(log):
            key = dict(headers or ()).get(KEY_HEADER)
            assert key is not None, "a record without a key was written"
            written.setdefault((known(k).decode(), key.decode()), []).append(offset)
    assert {qk: [o] for qk, (_, o) in model.first.items()} == written
    counts["keys"] = len(written)
    return counts


# scripts/idempotency_model.py runs more seeds and steps through these variables.
SEEDS = [int(s) for s in os.environ.get("VQ_IDEMPOTENCY_MODEL_SEEDS", "0,1,2,3,4,5").split(",")]
STEPS = int(os.environ.get("VQ_IDEMPOTENCY_MODEL_UNIT_STEPS", "150"))


@pytest.mark.parametrize("seed", SEEDS)
async def test_keyed_enqueues_across_snapshots_and_new_owners_follow_the_model(
        seed, monkeypatch):
    counts = await run_model(seed, STEPS, monkeypatch)
    print(f"idempotency model in memory, seed {seed}: {counts}")
    assert counts["snapshots"] and counts["new owners"] and counts["refused"]
