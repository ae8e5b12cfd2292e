"""Faults only a real cluster has, under enqueue, cursor, lease, keyed (each failed call sent
again as it was) and scheduled load: one broker of three SIGKILLed (the leader of the busy
partition) and restarted, one SIGSTOPped past its session, and all three stopped and started
again.

Each checks, through a successor node that knows only what Kafka kept, that no acknowledged
record (plain, keyed, scheduled), completion or committed offset was lost, that no keyed record
was stored twice and no scheduled one came twice, that no request got a 500, and prints how long
the node could not serve. The faults hit the session's local cluster and leave it whole again
(every broker back and in sync), so the tests after them run on a healthy cluster.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest

from tests.support import NodeProcess, create_topics, http
from vqueues.hashing import partition_for
from vqueues.kafka.local_cluster import LocalKafkaCluster

PARTITIONS = 4
CURSOR, WORK = "fault-cursor", "fault-work"
KEYED, SCHEDULED = "fault-keyed", "fault-scheduled"


@pytest.fixture
def cluster(kafka_cluster: LocalKafkaCluster | None) -> Iterator[LocalKafkaCluster]:
    if kafka_cluster is None:
        pytest.skip("the fault tests signal the local cluster's brokers; VQ_TEST_KAFKA_BOOTSTRAP "
                    "names an external one")
    yield kafka_cluster
    # Whatever the test did or where it failed, the next tests get every broker back, in sync.
    for p in kafka_cluster.processes:
        if p.running:
            kafka_cluster.signal(p.node_id, signal.SIGCONT)
        else:
            kafka_cluster.start_broker(p.node_id, wait=False)
    kafka_cluster.wait_ready(90)
    kafka_cluster.wait_in_sync(90)


@dataclass
class Loop:
    """One kind of call made over and over: when it succeeded, and how it failed."""

    name: str
    ok_at: list[float] = field(default_factory=list)
    errors: list[tuple[int, dict[str, object]]] = field(default_factory=list)
    timeouts: int = 0

    def longest_gap(self, since: float) -> float:
        """The longest time without a success after `since` (the node could not serve)."""
        times = [since, *(t for t in self.ok_at if t > since)]
        if len(times) == 1:
            return float("inf")
        return max(b - a for a, b in itertools.pairwise(times))


@dataclass
class Load:
    """Enqueue to two queues, read-and-ack one with a cursor consumer, lease-and-complete the
    other; remembers everything the node acknowledged."""

    url: str
    acked: dict[str, set[str]] = field(default_factory=lambda: {CURSOR: set(), WORK: set(),
                                                                 KEYED: set(),
                                                                 SCHEDULED: set()})
    completed: set[str] = field(default_factory=set)
    maybe_completed: set[str] = field(default_factory=set)
    committed: int = 0
    loops: dict[str, Loop] = field(default_factory=dict)
    stopping: bool = False

    async def call(self, s: aiohttp.ClientSession, loop: Loop, method: str, path: str,
                   body: object = None) -> dict[str, object] | None:
        try:
            async with s.request(method, self.url + path, json=body) as r:
                data = await r.json(content_type=None)
                if r.status == 200:
                    loop.ok_at.append(time.monotonic())
                    return dict(data)
                loop.errors.append((r.status, data))
        except (TimeoutError, aiohttp.ClientError):
            loop.timeouts += 1
        await asyncio.sleep(0.05)
        return None

    async def enqueue(self, s: aiohttp.ClientSession) -> None:
        loop = self.loops.setdefault("enqueue", Loop("enqueue"))
        n = 0
        while not self.stopping:
            for q in (CURSOR, WORK):
                values = [f"{q}-{n}-{k}" for k in range(10)]
                n += 1
                if await self.call(s, loop, "POST", f"/v1/queues/{q}/records",
                                   {"records": [{"value": v} for v in values]}) is not None:
                    self.acked[q].update(values)

    async def enqueue_keyed(self, s: aiohttp.ClientSession) -> None:
        """Records with idempotency keys; a call that failed is sent again as it was until it
        is answered 200, so each key must be stored once."""
        loop = self.loops.setdefault("keyed", Loop("keyed"))
        n = 0
        while not self.stopping:
            values = [f"{KEYED}-{n}-{k}" for k in range(5)]
            n += 1
            body = {"records": [{"value": v, "idempotency_key": v} for v in values]}
            while await self.call(s, loop, "POST", f"/v1/queues/{KEYED}/records",
                                  body) is None:
                pass
            self.acked[KEYED].update(values)

    async def enqueue_scheduled(self, s: aiohttp.ClientSession) -> None:
        """Records due 1 s later: each acknowledged one must come, once."""
        loop = self.loops.setdefault("scheduled", Loop("scheduled"))
        n = 0
        while not self.stopping:
            values = [f"{SCHEDULED}-{n}-{k}" for k in range(5)]
            n += 1
            if await self.call(s, loop, "POST", f"/v1/queues/{SCHEDULED}/records",
                               {"records": [{"value": v, "delay_ms": 1000} for v in values]}
                               ) is not None:
                self.acked[SCHEDULED].update(values)
            await asyncio.sleep(0.05)

    async def read_and_ack(self, s: aiohttp.ClientSession) -> None:
        loop = self.loops.setdefault("read+ack", Loop("read+ack"))
        while not self.stopping:
            page = await self.call(s, loop, "GET", f"/v1/queues/{CURSOR}/records?consumer=r"
                                   "&limit=100&wait_ms=200")
            if page and page["records"]:
                nxt = int(page["next_offset"])  # type: ignore[call-overload]
                if await self.call(s, loop, "POST", f"/v1/queues/{CURSOR}/consumers/r/ack",
                                   {"offset": nxt}) is not None:
                    self.committed = max(self.committed, nxt)

    async def lease_and_complete(self, s: aiohttp.ClientSession) -> None:
        loop = self.loops.setdefault("lease+complete", Loop("lease+complete"))
        while not self.stopping:
            got = await self.call(s, loop, "POST", f"/v1/queues/{WORK}/consumers/w/lease",
                                  {"max_records": 20, "visibility_ms": 5000, "wait_ms": 200})
            records = list(got["records"]) if got else []  # type: ignore[call-overload]
            if not records:
                continue
            values = {r["value"] for r in records}
            errors = len(loop.errors)
            if await self.call(s, loop, "POST", f"/v1/queues/{WORK}/consumers/w/complete",
                               {"tokens": [r["token"] for r in records]}) is not None:
                self.completed |= values
            elif len(loop.errors) == errors or loop.errors[-1][0] != 409:
                # No answer, or a broker error: the completion may have been written before
                # the answer was lost. Only a 409 (stale lease) says nothing was completed.
                self.maybe_completed |= values

    def outage(self, since: float) -> float:
        return max(loop.longest_gap(since) for loop in self.loops.values())

    def server_errors(self) -> list[tuple[str, int, dict[str, object]]]:
        """Answers that are neither a success nor a retriable JSON error (a 409 of a lease that
        ran out while the broker was away is fine)."""
        return [(loop.name, status, body) for loop in self.loops.values()
                for status, body in loop.errors
                if status in (400, 500) or (status > 500 and not retriable(body))]


def retriable(body: dict[str, object]) -> bool:
    error = body.get("error")
    return isinstance(error, dict) and error.get("retriable") is True


async def run_fault(node: NodeProcess, fault: Callable[[], Awaitable[None]]) -> tuple[Load, float]:
    """Load before, during and after `fault`; returns the load and when the fault began."""
    load = Load(node.url)
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        tasks = [asyncio.create_task(f(s)) for f in (load.enqueue, load.read_and_ack,
                                                    load.lease_and_complete,
                                                    load.enqueue_keyed,
                                                    load.enqueue_scheduled)]
        await asyncio.sleep(3)
        began = time.monotonic()
        await fault()
        # Served again: every loop has succeeded since the cluster came back, then a little more.
        back = time.monotonic()
        deadline = back + 60
        while not all(any(t > back for t in lp.ok_at) for lp in load.loops.values()):
            assert time.monotonic() < deadline, "the node did not serve again within 60 s"
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)
        load.stopping = True
        await asyncio.gather(*tasks)
    return load, began


def check_nothing_lost(t, load: Load) -> None:
    """A successor node, which knows only what Kafka kept, has every acknowledged record, the
    committed offset, and never delivers a completed record again."""
    successor = NodeProcess(t).start()
    try:
        time.sleep(1.5)  # the last scheduled records fall due
        for q in (CURSOR, WORK, KEYED, SCHEDULED):
            stored: list[str] = []
            offset = 0
            while True:
                page = http("GET", f"{successor.url}/v1/queues/{q}/records?offset={offset}"
                                   "&limit=1000")[1]
                stored += [r["value"] for r in page["records"]]
                if not page["records"]:
                    break
                offset = page["next_offset"]
            lost = load.acked[q] - set(stored)
            assert not lost, f"{len(lost)} acked records of {q} lost, e.g. {sorted(lost)[:3]}"
            if q in (KEYED, SCHEDULED):  # idempotent retries; moved once
                twice = sorted({v for v in stored if stored.count(v) > 1})
                assert not twice, f"{q}: stored twice {twice[:3]}"
        info = http("GET", f"{successor.url}/v1/queues/{CURSOR}/consumers/r")[1]
        assert info["offset"] >= load.committed
        # Drain the work queue: what comes back was never completed, and nothing acked is lost
        # (a record whose completion went unanswered may be done or may come back).
        redelivered: set[str] = set()
        pending = load.acked[WORK] - load.completed - load.maybe_completed
        deadline = time.monotonic() + 40
        while pending - redelivered:
            assert time.monotonic() < deadline, f"{len(pending - redelivered)} records never came"
            got = http("POST", f"{successor.url}/v1/queues/{WORK}/consumers/w/lease",
                       {"max_records": 500, "visibility_ms": 60000, "wait_ms": 1000})[1]
            values = [r["value"] for r in got["records"]]
            redelivered.update(values)
            if values:
                assert http("POST", f"{successor.url}/v1/queues/{WORK}/consumers/w/complete",
                            {"tokens": [r["token"] for r in got["records"]]})[0] == 200
        again = redelivered & load.completed
        assert not again, f"{len(again)} completed records came again, e.g. {sorted(again)[:3]}"
    finally:
        successor.terminate()


def start_node(bootstrap: str):
    t = create_topics(bootstrap, partitions=PARTITIONS)
    node = NodeProcess(t).start()
    assert http("PUT", f"{node.url}/v1/queues/{WORK}/consumers/w",
                {"mode": "lease", "max_attempts": 1000})[0] == 200
    return t, node


def report(name: str, load: Load, began: float) -> None:
    counts = {q: len(v) for q, v in load.acked.items()}
    print(f"\n{name}: node could not serve for {load.outage(began):.1f} s (longest gap between "
          f"successes, any call); acked {counts}, completed {len(load.completed)} (and "
          f"{len(load.maybe_completed)} unanswered), committed "
          f"offset {load.committed}; failed answers "
          f"{ {lp.name: (len(lp.errors), lp.timeouts) for lp in load.loops.values()} }")


def test_sigkill_of_the_busy_partitions_leader_then_its_restart(cluster, kafka_bootstrap):
    t, node = start_node(kafka_bootstrap)
    leader = cluster.leader(t.data, partition_for(WORK, PARTITIONS))

    async def fault() -> None:
        await asyncio.to_thread(cluster.signal, leader, signal.SIGKILL)
        await asyncio.sleep(8)  # past the broker session: the controller fences it, leaders move
        await asyncio.to_thread(cluster.start_broker, leader)
        await asyncio.to_thread(cluster.wait_in_sync)

    try:
        load, began = asyncio.run(run_fault(node, fault))
    finally:
        node.kill()
    report(f"SIGKILL of broker {leader} (leader of {WORK}'s partition), restart after 8 s",
           load, began)
    assert not load.server_errors()
    check_nothing_lost(t, load)


def test_sigstop_of_a_broker_past_its_session(cluster, kafka_bootstrap):
    t, node = start_node(kafka_bootstrap)
    leader = cluster.leader(t.data, partition_for(CURSOR, PARTITIONS))

    async def fault() -> None:
        await asyncio.to_thread(cluster.signal, leader, signal.SIGSTOP)
        await asyncio.sleep(10)
        await asyncio.to_thread(cluster.signal, leader, signal.SIGCONT)
        await asyncio.to_thread(cluster.wait_ready, 60)
        await asyncio.to_thread(cluster.wait_in_sync)

    try:
        load, began = asyncio.run(run_fault(node, fault))
    finally:
        node.kill()
    report(f"SIGSTOP of broker {leader} (leader of {CURSOR}'s partition) for 10 s", load, began)
    assert not load.server_errors()
    check_nothing_lost(t, load)


def test_all_three_brokers_stopped_and_started_again(cluster, kafka_bootstrap):
    t, node = start_node(kafka_bootstrap)

    async def fault() -> None:
        def bounce() -> None:
            for p in cluster.processes:
                cluster.signal(p.node_id, signal.SIGTERM)
            for p in cluster.processes:
                cluster.stop_broker(p.node_id)
            for p in cluster.processes:
                cluster.start_broker(p.node_id, wait=False)
            cluster.wait_ready(90)
            cluster.wait_in_sync()
        await asyncio.to_thread(bounce)

    try:
        load, began = asyncio.run(run_fault(node, fault))
    finally:
        node.kill()
    report("all three brokers stopped (SIGTERM) and started again", load, began)
    assert not load.server_errors()
    check_nothing_lost(t, load)
