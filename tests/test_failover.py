"""Failover: a node killed with SIGKILL, another stopped with SIGTERM and restarted, while
producers and consumers run through the client on many queues."""

import asyncio
import time
import uuid
from collections import defaultdict

import pytest
from vqueues_client import AsyncClient, VQError

from tests.narrow import known
from tests.support import LOGS, NodeProcess, create_topics, http, start_cluster, wait_settled
from vqueues.hashing import partition_for

PARTITIONS = 12
QUEUES = 24


async def producer(vq, queue, stop, acked):
    i = 0
    while not stop.is_set():
        values = [f"{queue}:{i + k}" for k in range(5)]
        try:
            await vq.enqueue(queue, values)
            acked[queue].extend(values)
        except VQError:
            pass  # not acknowledged: may or may not be in the queue
        i += 5
        await asyncio.sleep(0.05)


async def consumer(vq, queue, done, delivered, acks):
    """Reads as consumer 'c' and acks after processing each page."""
    while not done.is_set():
        try:
            page = await vq.read(queue, consumer="c", limit=50, wait_ms=300)
        except VQError:
            continue
        if not page.records:
            continue
        delivered[queue].extend((r.offset, r.text) for r in page.records)
        try:
            res = await vq.ack(queue, "c", page.next_offset)
            acks[queue].append((res["previous_offset"], page.next_offset))
        except VQError:
            pass  # the page is read again: at-least-once


async def monitor(nodes, stop, outages):
    """Probe every partition every 100 ms through its current owner; record unavailability."""
    probe = {}
    for p in range(PARTITIONS):
        probe[p] = next(f"probe-{i}" for i in range(10**5)
                        if partition_for(f"probe-{i}", PARTITIONS) == p)
    down_since: dict[int, float] = {}
    async with AsyncClient([n.url for n in nodes], deadline_s=0.3, refresh_interval_s=0.5) as vq:
        while not stop.is_set():
            t = time.monotonic()
            for p, q in probe.items():
                try:
                    await vq.read(q, limit=1)
                    if p in down_since:
                        outages[p].append(t - down_since.pop(p))
                except VQError:
                    down_since.setdefault(p, t)
            await asyncio.sleep(0.1)
        for p, since in down_since.items():
            outages[p].append(time.monotonic() - since)


@pytest.mark.both_brokers
async def test_no_acknowledged_record_is_lost_and_no_offset_moves_back(bootstrap):
    t = create_topics(bootstrap, partitions=PARTITIONS)
    nodes = start_cluster(t, 3)
    victim, restarted, _ = nodes  # the third node stays up throughout
    run = uuid.uuid4().hex[:6]
    queues = [f"fo-{run}-{i}" for i in range(QUEUES)]
    acked: defaultdict[str, list[str]] = defaultdict(list)  # the values
    delivered: defaultdict[str, list[tuple[int, str | None]]] = defaultdict(list)
    acks: defaultdict[str, list[tuple[int | None, int]]] = defaultdict(list)
    outages: dict[int, list[float]] = defaultdict(list)
    stop_producing, done, stop_monitor = asyncio.Event(), asyncio.Event(), asyncio.Event()
    try:
        async with AsyncClient([n.url for n in nodes], deadline_s=60) as vq:
            tasks = [asyncio.create_task(producer(vq, q, stop_producing, acked)) for q in queues]
            tasks += [asyncio.create_task(consumer(vq, q, done, delivered, acks)) for q in queues]
            mon = asyncio.create_task(monitor(nodes, stop_monitor, outages))
            await asyncio.sleep(3)
            victim.kill()
            await asyncio.sleep(4)
            assert await asyncio.to_thread(restarted.terminate) == 0
            await asyncio.sleep(2)
            await asyncio.to_thread(restarted.start, False)
            await asyncio.to_thread(wait_settled, nodes, PARTITIONS)
            await asyncio.sleep(3)
            stop_producing.set()
            await asyncio.gather(*tasks[:QUEUES])
            # Let the consumers catch up with everything acknowledged.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                seen = {q: {v for _, v in delivered[q]} for q in queues}
                if all(set(acked[q]) <= seen[q] for q in queues):
                    break
                await asyncio.sleep(0.2)
            done.set()
            stop_monitor.set()
            await asyncio.gather(*tasks[QUEUES:], mon)
            final = {q: await vq.queue_info(q) for q in queues}
    finally:
        for n in nodes:
            n.terminate()

    total_acked = sum(len(v) for v in acked.values())
    assert total_acked > QUEUES * 20, "the load did not run"
    for q in queues:
        values = [v for _, v in delivered[q]]
        # 1. Nothing acknowledged to a producer is lost.
        missing = set(acked[q]) - set(values)
        assert not missing, f"{q}: {len(missing)} acknowledged records never delivered"
        # 2. No committed offset moves backwards: every ack saw the previous one.
        last = None
        for previous, new in acks[q]:
            if last is not None:
                assert previous is not None and previous >= last, f"{q}: offset moved back"
            last = new
        assert known(final[q])["consumers"][0]["offset"] >= last
        # 3. At least once, none skipped: the first deliveries are in offset order, no gaps
        #    among the acknowledged records of each producer.
        first_seen = list(dict.fromkeys(values))
        acked_order = [v for v in first_seen if v in set(acked[q])]
        assert acked_order == acked[q], f"{q}: delivered out of order or with gaps"
        offsets = [o for o, _ in dict.fromkeys(delivered[q])]
        assert offsets == sorted(offsets)
    worst = {p: round(max(v), 2) for p, v in sorted(outages.items())}
    print(f"\nfailover: {total_acked} records acknowledged over {QUEUES} queues; "
          f"{sum(len(d) for d in delivered.values())} deliveries "
          f"({sum(len(d) for d in delivered.values()) - total_acked} redeliveries or unacked)")
    print(f"failover: longest unavailability per partition (s): {worst}")


@pytest.mark.both_brokers
def test_sigterm_hands_partitions_over_well_before_the_session_timeout(bootstrap, broker,
                                                                       broker_kind):
    """With a 20 s session timeout, a node stopped with SIGTERM finishes its in-flight
    requests, releases its partitions and leaves the group at once, so they move before the
    session timeout (a node that did not leave holds them for the timeout, then the rebalance).
    That is a dynamic member's stop (`static_membership` off); a static member keeps its
    partitions for a restart instead (the next test).

    On Kafka the move takes a rebalance (seconds); tansu holds every rebalance for half the
    session timeout (10 s here), which is the figure this test prints on the embedded broker.
    """
    t = create_topics(bootstrap, partitions=6)
    slow_session = {"VQ_SESSION_TIMEOUT_MS": "20000", "VQ_HEARTBEAT_INTERVAL_MS": "1000",
                    "VQ_STATIC_MEMBERSHIP": "off"}
    nodes = start_cluster(t, 2, env={0: slow_session, 1: slow_session})
    leaving, staying = nodes
    try:
        mine = http("GET", f"{leaving.url}/v1/partitions")[1]["owned"]
        assert mine
        q = next(f"g-{i}" for i in range(10**5) if partition_for(f"g-{i}", 6) == mine[0])

        async def long_poll_then_sigterm():
            async def poll():
                return await asyncio.to_thread(
                    http, "GET", f"{leaving.url}/v1/queues/{q}/records?wait_ms=15000")
            reader = asyncio.create_task(poll())
            await asyncio.sleep(0.5)
            t0 = time.monotonic()
            rc = await asyncio.to_thread(leaving.terminate)
            return rc, await reader, t0

        rc, (status, body), t0 = asyncio.run(long_poll_then_sigterm())
        stopped_after = time.monotonic() - t0
        assert rc == 0
        assert status == 200 and body["records"] == []  # answered, not cut off
        assert stopped_after < 5, f"the node took {stopped_after:.1f}s to stop"
        # Its releases are in the map at once: no client is sent to the stopped node.
        owners = http("GET", f"{staying.url}/v1/partitions")[1]["owners"]
        assert all(o["node"] != leaving.node_id for o in owners.values())
        wait_settled([staying], 6, timeout_s=40)
        moved_after = time.monotonic() - t0
        print(f"\ngraceful hand-over: node stopped after {stopped_after:.2f}s, all partitions "
              f"served by the other node after {moved_after:.1f}s (session timeout 20s)")
        embedded = broker == "default" and broker_kind == "embedded"
        assert moved_after < (20 if embedded else 8)
        body = http("GET", f"{staying.url}/v1/partitions")[1]
        assert {o["node"] for o in body["owners"].values()} == {staying.node_id}
    finally:
        for n in nodes:
            n.terminate()


def test_a_static_member_restarted_in_place_gets_its_partitions_back_at_once(kafka_bootstrap):
    """Static membership (KIP-345, Kafka's group.instance.id = node id; off by default, and not
    supported by the embedded broker's coordinator): a node stopped with SIGTERM
    and started again within the session timeout takes its own partitions back without a
    rebalance, and the other node's partitions never move."""
    t = create_topics(kafka_bootstrap, partitions=6)
    session = {"VQ_SESSION_TIMEOUT_MS": "20000", "VQ_HEARTBEAT_INTERVAL_MS": "1000",
               "VQ_STATIC_MEMBERSHIP": "on"}
    nodes = start_cluster(t, 2, env={0: session, 1: session})
    restarting, staying = nodes
    try:
        mine = http("GET", f"{restarting.url}/v1/partitions")[1]["owned"]
        theirs = http("GET", f"{staying.url}/v1/partitions")[1]["owned"]
        assert mine and theirs
        q = next(f"s-{i}" for i in range(10**5) if partition_for(f"s-{i}", 6) == mine[0])
        assert http("POST", f"{restarting.url}/v1/queues/{q}/records",
                    {"records": [{"value": "kept"}]})[0] == 200
        assert restarting.terminate() == 0
        t0 = time.monotonic()
        restarting.start(wait_ready=False)
        first_read = None
        while time.monotonic() - t0 < 15:
            status, body = http("GET", f"{restarting.url}/v1/queues/{q}/records", timeout_s=5)
            if status == 200:
                first_read = time.monotonic() - t0
                assert [r["value"] for r in body["records"]] == ["kept"]
                break
            time.sleep(0.05)
        assert first_read is not None, "the restarted node did not serve its queue"
        owned = wait_settled(nodes, 6, timeout_s=30)
        all_ready = time.monotonic() - t0
        assert sorted(p for p, url in owned.items() if url == restarting.url) == sorted(mine)
        assert http("GET", f"{staying.url}/v1/partitions")[1]["owned"] == theirs
        print(f"\nstatic member restarted in place: first read {first_read:.2f}s, every "
              f"partition ready {all_ready:.2f}s after the start (session timeout 20s)")
        assert first_read < 15  # well inside the session: no rebalance waited for
    finally:
        for n in nodes:
            n.terminate()


def test_a_fenced_static_member_makes_a_new_consumer_and_serves_again(kafka_bootstrap):
    """A static member can be fenced by a member with its own `group.instance.id` (after all the
    brokers restart, librdkafka's rejoin can meet the member's earlier incarnation): a fatal
    FENCED_INSTANCE_ID for that consumer. The node drops its partitions as lost, makes a new
    consumer with the same id, takes the partitions back and serves again."""
    from confluent_kafka import Consumer

    t = create_topics(kafka_bootstrap, partitions=2)
    node = NodeProcess(t, extra_env={"VQ_STATIC_MEMBERSHIP": "on"}).start()
    try:
        q = "fenced-0"
        assert http("POST", f"{node.url}/v1/queues/{q}/records",
                    {"records": [{"value": "before"}]})[0] == 200
        # Another consumer joins with the node's instance id: the coordinator hands it the
        # member's place, and fences the node's consumer.
        impostor = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"{t.prefix}-nodes",
                             "group.instance.id": node.node_id, "session.timeout.ms": 6000,
                             "partition.assignment.strategy": "cooperative-sticky"})
        impostor.subscribe([t.data])
        deadline = time.monotonic() + 30
        while not impostor.assignment():
            assert time.monotonic() < deadline, "the impostor never got the member's partitions"
            impostor.poll(0.1)
        impostor.close()  # a static member does not leave: its place waits for the node
        t0 = time.monotonic()
        fenced = False
        while time.monotonic() - t0 < 30:
            status, body = http("POST", f"{node.url}/v1/queues/{q}/records",
                                {"records": [{"value": "after"}]}, timeout_s=5)
            if status != 200:
                fenced = True
                assert status == 503 and body["error"]["retriable"], (status, body)
            elif fenced:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the node never served again after it was fenced")
        print(f"\nfenced static member served again {time.monotonic() - t0:.2f}s after the "
              "impostor left")
        page = http("GET", f"{node.url}/v1/queues/{q}/records")[1]
        assert [r["value"] for r in page["records"]][:2] == ["before", "after"]
        log = (LOGS / f"{t.prefix}-{node.node_id}.log").read_text()
        assert "group_member_replaced" in log
    finally:
        node.terminate()
