"""Growing a running cluster's partitions (ADR 19, docs/growing.md) against real brokers and
node processes: `vqueues topics grow` while nodes serve; every record, position, lease,
scheduled record, idempotency key and deletion carried over."""

import asyncio
import random
import time
import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from vqueues_client import AsyncClient, NewRecord
from vqueues_client.errors import VQError

from tests.narrow import known
from tests.support import (
    NodeProcess,
    Topics,
    create_topics,
    http,
    kafka_records,
    start_cluster,
    vqueues_cli,
)
from vqueues.hashing import partition_for
from vqueues.layouts import decode_cut, layout_of


def grow(t: Topics, partitions: int) -> None:
    out = vqueues_cli("topics", "grow", "--bootstrap", t.bootstrap, "--partitions",
                      str(partitions), "--data-topic", t.data, "--offset-topic", t.offsets,
                      "--assignment-topic", t.assignments, "--snapshot-topic", t.snapshots)
    assert out.returncode == 0, out.stderr


def cut_partitions(t: Topics, layout: int) -> set[int]:
    """The partitions the assignment topic says were cut for `layout`."""
    found = (decode_cut(key.encode(), value)
             for key, value, _, _ in kafka_records(t.bootstrap, t.assignments).values())
    return {cut.partition for cut in found if cut is not None and cut.layout == layout}


def wait_layout(nodes: list[NodeProcess], layout: int, partitions: int,
                timeout_s: float = 120.0) -> None:
    """Until every live node serves `layout` and its partitions are all owned and ready."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        ready: set[int] = set()
        ok = True
        for n in nodes:
            if n.process is None:
                continue
            status, body = http("GET", f"{n.url}/v1/partitions", timeout_s=5)
            if status != 200 or body.get("layout") != layout:
                ok = False
                last = (n.node_id, status, body if status != 200 else body.get("layout"))
                break
            ready.update(body["ready"])
        if ok and ready == set(range(partitions)):
            return
        time.sleep(0.2)
    raise TimeoutError(f"layout {layout} not served: {last}")


@pytest.mark.both_brokers
async def test_a_growth_carries_every_queue_over(bootstrap: str) -> None:
    t = create_topics(bootstrap, partitions=4)
    nodes = start_cluster(t, 2, env={i: {"VQ_SCHEDULER_TICK_MS": "100"} for i in range(2)})
    try:
        async with AsyncClient([n.url for n in nodes]) as vq:
            queues = [f"g-{uuid.uuid4().hex[:6]}-{i}" for i in range(24)]
            written: dict[str, list[int]] = {}
            for q in queues:
                answer = await vq.enqueue(q, [NewRecord(f"{q}:{i}") for i in range(5)])
                written[q] = list(known(answer.offsets))
            moved = [q for q in queues if partition_for(q, 8) != partition_for(q, 4)]
            assert moved and len(moved) < len(queues)
            cursor_q, lease_q, keyed_q, gone_q, later_q = queues[:5]
            await vq.ack(cursor_q, "c", written[cursor_q][2])
            await vq.configure_consumer(lease_q, "w", mode="lease", max_attempts=5)
            leased = await vq.lease(lease_q, "w", max_records=3, visibility_ms=120_000)
            await vq.complete(lease_q, "w", leased[:1])
            first = await vq.enqueue(keyed_q, "once", idempotency_key="k-1")
            await vq.delete_queue(gone_q)
            due = await vq.enqueue(later_q, "later", delay_ms=12_000)

            grow(t, 8)
            wait_layout(nodes, 1, 8)

            for q in queues:
                page = await vq.read(q, offset=0, limit=100)
                if q == gone_q:
                    assert page.records == []
                    continue
                offsets = [r.offset for r in page.records][:5]
                assert offsets == written[q], q
                assert [r.text for r in page.records][:5] == [f"{q}:{i}" for i in range(5)]
            page = await vq.read(cursor_q, consumer="c")
            assert [r.offset for r in page.records] == written[cursor_q][2:]
            done = await vq.complete(lease_q, "w", leased[1:])  # tokens of the old layout
            assert done is not None
            again = await vq.lease(lease_q, "w", max_records=10, visibility_ms=120_000)
            assert [lease.record.offset for lease in again] == written[lease_q][3:]
            repeat = await vq.enqueue(keyed_q, "once", idempotency_key="k-1")
            assert repeat.offsets == first.offsets
            new = await vq.enqueue(queues[5], "after")
            assert layout_of(known(new.offsets)[0]) == 1
            assert new.partition == partition_for(queues[5], 8)
            page = await vq.read(queues[5], offset=0, limit=100)
            assert [r.text for r in page.records][-1] == "after"
            # A plain Kafka producer still writing the old layout's topic: forwarded, in order.
            late_q = queues[6]
            producer = Producer({"bootstrap.servers": t.bootstrap, "acks": "all"})
            for i in range(3):
                producer.produce(t.data, key=late_q.encode(), value=f"late-{i}".encode(),
                                 partition=partition_for(late_q, 4))
            assert producer.flush(30) == 0
            deadline = time.monotonic() + 30
            while True:
                page = await vq.read(late_q, offset=0, limit=100)
                texts = [r.text for r in page.records]
                if "late-2" in texts:
                    break
                assert time.monotonic() < deadline, f"not forwarded: {texts}"
                await asyncio.sleep(0.2)
            assert texts == [f"{late_q}:{i}" for i in range(5)] + [f"late-{i}" for i in range(3)]
            assert all(layout_of(r.offset) == 1 for r in page.records[5:])
            assert [r.headers["vq-forwarded-from"].split("/")[:2] for r in page.records[5:]] \
                == [["l0", str(partition_for(late_q, 4))]] * 3
            deadline = time.monotonic() + 30
            while True:
                page = await vq.read(later_q, offset=0, limit=100)
                if [r.text for r in page.records].count("later") == 1:
                    break
                assert time.monotonic() < deadline, "the scheduled record did not fire"
                await asyncio.sleep(0.2)
            assert due.offsets is not None
        assert cut_partitions(t, 1) == {0, 1, 2, 3}
    finally:
        for n in nodes:
            n.terminate()


async def _write(vq: AsyncClient, queue: str, stop: asyncio.Event, acked: list[int]) -> None:
    i = 0
    while not stop.is_set():
        # With a key: a write retried after the SIGKILL cut its answer off is stored once.
        await vq.enqueue(queue, f"{i}", idempotency_key=f"{queue}:{i}")
        acked.append(i)
        i += 1
        await asyncio.sleep(0.01)


async def _read(vq: AsyncClient, queue: str, done: asyncio.Event, seen: list[int],
                acked: list[int]) -> None:
    while not (done.is_set() and len(seen) >= len(acked)):
        page = await vq.read(queue, consumer="c", limit=50, wait_ms=200)
        seen.extend(int(known(r.text)) for r in page.records)
        if page.records:
            await vq.ack(queue, "c", page.next_offset)


async def _work(vq: AsyncClient, queue: str, done: asyncio.Event, completed: list[int],
                acked: list[int]) -> None:
    await vq.configure_consumer(queue, "w", mode="lease", visibility_ms=5000)
    while not (done.is_set() and set(completed) >= set(acked)):
        got = await vq.lease(queue, "w", max_records=10, visibility_ms=5000, wait_ms=200)
        if got:
            try:
                await vq.complete(queue, "w", got)
            except VQError as exc:
                # What a failover may cost (docs/work-queues.md): a grant the new owner never
                # saw; the records come again after their deadline.
                assert exc.code == "lease_expired", exc
                continue
            completed.extend(int(known(lease.record.text)) for lease in got)


@pytest.mark.both_brokers
async def test_a_growth_under_load_with_a_node_killed_loses_and_repeats_nothing(
        bootstrap: str) -> None:
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    t = create_topics(bootstrap, partitions=4)
    nodes = start_cluster(t, 3)
    try:
        async with AsyncClient([n.url for n in nodes], deadline_s=90) as vq:
            cursor_queues = [f"gc-{uuid.uuid4().hex[:6]}-{i}" for i in range(8)]
            work_queues = [f"gw-{uuid.uuid4().hex[:6]}-{i}" for i in range(4)]
            acked: dict[str, list[int]] = {q: [] for q in cursor_queues + work_queues}
            seen: dict[str, list[int]] = {q: [] for q in cursor_queues}
            completed: dict[str, list[int]] = {q: [] for q in work_queues}
            stop, done = asyncio.Event(), asyncio.Event()
            writers = [asyncio.create_task(_write(vq, q, stop, acked[q])) for q in acked]
            tasks = [asyncio.create_task(_read(vq, q, done, seen[q], acked[q]))
                      for q in cursor_queues]
            tasks += [asyncio.create_task(_work(vq, q, done, completed[q], acked[q]))
                      for q in work_queues]
            await asyncio.sleep(rng.uniform(1.0, 3.0))
            await asyncio.to_thread(grow, t, 8)
            await asyncio.sleep(rng.uniform(0.0, 1.5))
            victim = rng.choice(nodes)
            victim.kill()
            await asyncio.to_thread(wait_layout, nodes, 1, 8, 180.0)
            victim.start(wait_ready=False)
            await asyncio.to_thread(wait_layout, nodes, 1, 8, 180.0)
            await asyncio.sleep(2.0)
            stop.set()
            await asyncio.wait_for(asyncio.gather(*writers), 120)
            done.set()
            await asyncio.wait_for(asyncio.gather(*tasks), 180)
        for q in cursor_queues:
            assert seen[q] == acked[q], (seed, q)  # each once, in order, nothing lost
        for q in work_queues:
            assert set(completed[q]) == set(acked[q]), (seed, q)
        assert cut_partitions(t, 1) == {0, 1, 2, 3}, seed
    finally:
        for n in nodes:
            n.terminate()
