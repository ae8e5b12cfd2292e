"""Idempotent enqueue against a model of the documented rule (docs/api.md), through the in-memory
logs: random keyed requests (plain, scheduled by `deliver_at` or `delay_ms`, repeats within and
across requests, other payloads), snapshots and new owners (from the latest snapshot or by
replay) at random points. Every key maps to exactly one record, every refusal is
`409 idempotency_key_reused` naming what it should, and nothing else is written.

The same model runs against real node processes in tests/test_idempotency_model.py."""

import asyncio
import json
import os
import random
import time
from typing import Any

import pytest

from tests.narrow import known
from tests.unit.fakes import MemoryFetcher, MemoryLog
from vqueues.api import enqueue_body
from vqueues.api.enqueue_body import decode_enqueue
from vqueues.errors import VQError
from vqueues.hashing import partition_for
from vqueues.ownership.ownership import Ownership
from vqueues.queues.service import QueueService
from vqueues.records import Record
from vqueues.settings import Settings
from vqueues.snapshot.capture import capture
from vqueues.snapshot.format import manifest_key
from vqueues.snapshot.wire import encode
from vqueues.state.cache import RecordCache
from vqueues.state.idempotency import KEY_HEADER

pytestmark = pytest.mark.unit
PARTITIONS = 2
QUEUES = ("orders", "mail", "jobs")


class KeyModel:
    """The documented rule: within the window a key of a queue maps to the first record sent
    with it; a repeat with the same payload (value, headers, tags, schedule as given) answers
    its offset, another payload is refused, and a refused request writes nothing."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions  # offsets are a partition's
        self.first: dict[tuple[str, str], tuple[str, int]] = {}  # (queue, key) -> (payload, offset)

    @staticmethod
    def payload(record: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in record.items() if k != "idempotency_key"},
                          sort_keys=True)

    def expect(self, queue: str, records: list[dict[str, Any]]
               ) -> tuple[dict[str, Any] | None, list[Any]]:
        """(the refusal expected, or None; per record the offset expected: an int, a new
        key's ("new", key), or ("same", index) for a repeat within the request)."""
        out: list[Any] = []
        in_request: dict[str, tuple[int, str]] = {}
        for i, record in enumerate(records):
            key, payload = record["idempotency_key"], self.payload(record)
            known = self.first.get((queue, key))
            if known is not None:
                if known[0] != payload:
                    return {"index": i, "first_offset": known[1]}, []
                out.append(known[1])
            elif key in in_request:
                first, first_payload = in_request[key]
                if first_payload != payload:
                    return {"index": i, "first_index": first}, []
                out.append(("same", first))
            else:
                in_request[key] = (i, payload)
                out.append(("new", key))
        return None, out

    def check(self, queue: str, records: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        """An answer against the model; the new keys are learnt."""
        refusal, expected = self.expect(queue, records)
        if refusal is not None:
            error = answer.get("error")
            assert error is not None, (records, answer, refusal)
            assert error["code"] == "idempotency_key_reused" and error["index"] == refusal["index"]
            if "first_offset" in refusal:
                assert error["first_offset"] == refusal["first_offset"]
            else:
                assert error["first_index"] == refusal["first_index"]
            return
        assert "error" not in answer, (records, answer, self.first)
        offsets = answer["offsets"]
        p = partition_for(queue, self.partitions)
        taken = {o for (q, _), (_, o) in self.first.items()
                 if partition_for(q, self.partitions) == p}
        for i, (want, got) in enumerate(zip(expected, offsets, strict=True)):
            if isinstance(want, int):
                assert got == want, (i, records, offsets)
            elif want[0] == "same":
                assert got == offsets[want[1]], (i, records, offsets)
            else:
                assert got not in taken, (i, records, offsets)
                self.first[(queue, want[1])] = (self.payload(records[i]), got)


class Requests:
    """Random keyed enqueue requests in the API's JSON shape: often sent again unchanged, keys
    often sent again with their first record in another request, new keys all along."""

    def __init__(self, rng: random.Random, now_ms) -> None:
        self.rng, self.now_ms = rng, now_ms
        self.sent: list[tuple[str, list[dict[str, Any]]]] = []
        self.due: dict[str, int] = {}  # key -> the deliver_at it was first sent with
        # (queue, key) -> the record first sent
        self.first: dict[tuple[str, str], dict[str, Any]] = {}

    def record(self, key: str, queue: str = "") -> dict[str, Any]:
        rng = self.rng
        known = self.first.get((queue, key))
        if known is not None and rng.random() < 0.6:
            return dict(known)  # the same record again, in another request
        record: dict[str, Any] = {"value": rng.choice(["a", "b"]), "idempotency_key": key}
        if rng.random() < 0.2:
            record["headers"] = {"h": rng.choice(["1", "2"])}
        if rng.random() < 0.15:
            record["tags"] = [rng.choice(["red", "blue"])]
        roll = rng.random()
        if roll < 0.25:  # due soon after it is first sent: retries come before and after
            due = self.due.setdefault(key, self.now_ms() + rng.choice([30, 80, 200]))
            record["deliver_at"] = due if rng.random() < 0.9 else due + 1
        elif roll < 0.45:
            record["delay_ms"] = rng.choice([50, 5_000])
        return record

    def next(self) -> tuple[str, list[dict[str, Any]]]:
        rng = self.rng
        if self.sent and rng.random() < 0.4:
            return rng.choice(self.sent)  # a retry, as sent
        queue = rng.choice(QUEUES)
        pool = 8 + len(self.sent) // 4  # new keys keep coming
        keys = [f"k{rng.randrange(pool)}" for _ in range(rng.randint(1, 4))]
        records = [self.record(k, queue) for k in keys]
        if rng.random() < 0.2:  # a key repeated within the request, as sent or not
            records.append(dict(records[0]) if rng.random() < 0.5 else self.record(keys[0]))
        for record in records:
            self.first.setdefault((queue, record["idempotency_key"]), record)
        self.sent.append((queue, records))
        return queue, records


class Owner:
    """A node over the shared in-memory logs: it restores from the latest snapshot (if any)
    and replays the rest, as a new owner does."""

    def __init__(self, logs, settings: Settings) -> None:
        self.data, self.offsets, self.snapshots = logs
        self.settings = settings

    async def start(self) -> "Owner":
        loop = asyncio.get_running_loop()
        cache = RecordCache(1 << 20)
        own = self.own = Ownership(loop, PARTITIONS, cache, self.offsets, node_id="n",
                                   url="http://n", snapshot_log=self.snapshots)
        self.svc = QueueService(self.settings, own, cache, self.data, self.offsets,
                                MemoryFetcher(self.data))
        starts = await asyncio.to_thread(own.assigned, list(range(PARTITIONS)))
        for p in range(PARTITIONS):
            log = self.data.partitions.get(p, [])
            start = starts.get(p, 0)
            batch = [(p, k, Record(o, self.data.timestamp, v, tuple(h or ())))
                     for o, (k, v, h) in enumerate(log) if o >= start]
            if batch:
                await asyncio.to_thread(own.consumed, batch, {p: len(log)}, {p: len(log)})
            await asyncio.to_thread(own.reached_end, p, len(log))
        for _ in range(400):
            if own.ready:
                break
            await asyncio.sleep(0.005)
        assert own.ready
        self.data.tail = own
        return self

    async def snapshot(self) -> None:
        """What Maintenance.write_snapshot writes, for every partition."""
        for p, state in self.own.states.items():
            assert await state.wait_writes(1.0)
            image = await capture(state, state.offsets_position)
            chunks, manifest = encode(image, int(time.time() * 1000))
            await self.snapshots.append(p, [(k, v, None) for k, v in chunks])
            await self.snapshots.append(p, [(manifest_key(p), manifest, None)])

    async def send(self, queue: str, records: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            new = decode_enqueue(json.dumps({"records": records}).encode(), self.settings)
            return {"offsets": (await self.svc.enqueue(queue, new)).offsets}
        except VQError as exc:
            return exc.to_json()

    def close(self) -> None:
        self.svc.close()


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
