"""Work queues against the real broker and real node processes: competing workers, redelivery,
dead letters, per-key order, a SIGKILL under load, delayed retries, the WebSocket stream and bad
input (docs/work-queues.md)."""

import asyncio
import time
import uuid
from collections import Counter, defaultdict
from typing import Any

import aiohttp
import pytest
from vqueues_client import AsyncClient, Worker

from tests.narrow import known
from tests.support import NodeProcess, create_topics, http


def qname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def fill(vq: AsyncClient, queue: str, values: list[str], key: str | None = None) -> None:
    from vqueues_client import NewRecord
    headers = {"vq-ordering-key": key} if key else None
    for i in range(0, len(values), 500):
        await vq.enqueue(queue, [NewRecord(v, headers) for v in values[i:i + 500]])


@pytest.mark.both_brokers
async def test_eight_workers_complete_twenty_thousand_records_over_fifty_queues_once(node):
    queues = [qname(f"wq{i}") for i in range(50)]
    seen: Counter[tuple[str, str | None]] = Counter()
    async with AsyncClient(node.url) as vq:
        await asyncio.gather(*(fill(vq, q, [f"{q}:{i}" for i in range(400)]) for q in queues))

        async def lease_loop(stop: asyncio.Event) -> None:
            turn = 0
            while not stop.is_set():
                q = queues[turn % len(queues)]
                turn += 1
                got = await vq.lease(q, "pool", max_records=50, visibility_ms=60_000)
                for lease in got:
                    seen[(q, lease.text)] += 1
                if got:
                    await vq.complete(q, "pool", got)

        stop = asyncio.Event()
        workers = [asyncio.create_task(lease_loop(stop)) for _ in range(8)]
        deadline = time.monotonic() + 240
        while sum(seen.values()) < 20_000 and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.5)  # anything delivered twice would show up now
        stop.set()
        await asyncio.gather(*workers)
        assert len(seen) == 20_000 and set(seen.values()) == {1}
        for q in queues[:5]:
            info = await vq.queue_info(q)
            assert info is not None
            pool = next(c for c in info["consumers"] if c["consumer"] == "pool")
            assert (pool["mode"], pool["lag"], pool["in_flight"]) == ("lease", 0, 0)
            assert pool["offset"] == info["last_offset"] + 1


@pytest.mark.both_brokers
async def test_a_worker_that_stops_mid_lease_has_its_records_redelivered_to_another(node):
    q = qname("stuck")
    async with AsyncClient(node.url) as vq:
        await fill(vq, q, ["a", "b"])
        held = await vq.lease(q, "w", max_records=2, visibility_ms=800)
        assert [x.text for x in held] == ["a", "b"]
        assert await vq.lease(q, "w", max_records=2) == []  # held by the stalled worker
        started = time.monotonic()
        again = await vq.lease(q, "w", max_records=2, wait_ms=5000)
        assert time.monotonic() - started >= 0.5
        assert [(x.text, x.attempt) for x in again] == [("a", 2), ("b", 2)]
        status, body = http("POST", f"{node.url}/v1/queues/{q}/consumers/w/complete",
                            {"tokens": [held[0].token]})
        assert status == 409 and body["error"]["code"] == "lease_expired"
        assert body["error"]["retriable"] is False
        await vq.complete(q, "w", again)


async def test_the_worker_helper_redelivers_what_a_stopped_worker_held(node):
    q = qname("handover")
    async with AsyncClient(node.url) as vq:
        await fill(vq, q, [f"r{i}" for i in range(6)])
        release = asyncio.Event()

        async def stuck(lease):
            await release.wait()

        first = Worker(vq, q, "w", stuck, concurrency=3, visibility_ms=1000, wait_ms=200)
        runner = asyncio.create_task(first.run())
        await asyncio.sleep(0.5)
        # The first worker dies without a word (its tasks vanish, its leases stay).
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        done: list[str] = []

        async def handle(lease):
            done.append(lease.text)

        second = Worker(vq, q, "w", handle, concurrency=3, visibility_ms=5000, wait_ms=200)
        runner = asyncio.create_task(second.run())
        deadline = time.monotonic() + 20
        while len(done) < 6 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await second.stop()
        await runner
        assert sorted(done) == [f"r{i}" for i in range(6)]
        info = await vq.queue_info(q)
        assert info is not None and info["consumers"][0]["lag"] == 0


async def test_a_poison_record_lands_in_the_dead_letter_queue_after_max_attempts(node):
    q, dlq = qname("poison"), qname("poison-dlq")
    async with AsyncClient(node.url) as vq:
        await vq.configure_consumer(q, "w", mode="lease", max_attempts=3, dead_letter_queue=dlq)
        await fill(vq, q, ["bad", "good"])
        attempts: Counter[str] = Counter()

        async def handle(lease):
            attempts[lease.text] += 1
            if lease.text == "bad":
                raise ValueError("cannot parse")

        worker = Worker(vq, q, "w", handle, concurrency=2, wait_ms=200, backoff_initial_ms=50,
                        backoff_max_ms=100)
        runner = asyncio.create_task(worker.run())
        page = await vq.read(dlq, wait_ms=15_000)
        await worker.stop()
        await runner
        assert attempts == {"bad": 3, "good": 1}
        assert [r.text for r in page.records] == ["bad"]
        headers = page.records[0].headers
        assert headers["vq-dlq-source-queue"] == q
        assert headers["vq-dlq-consumer"] == "w"
        assert headers["vq-dlq-attempts"] == "3"
        assert headers["vq-dlq-reason"] == "ValueError: cannot parse"
        assert int(headers["vq-dlq-source-offset"]) >= 0
        info = await vq.queue_info(q)
        assert info is not None
        assert (info["consumers"][0]["dead_lettered"], info["consumers"][0]["lag"]) == (1, 0)


async def test_a_last_attempt_whose_lease_expires_is_dead_lettered_then(node):
    """Nobody leases again: the expiry itself sends the record to the dead letters."""
    q, dlq = qname("expiring"), qname("expiring-dlq")
    async with AsyncClient(node.url) as vq:
        await vq.configure_consumer(q, "w", mode="lease", max_attempts=1, dead_letter_queue=dlq)
        await fill(vq, q, ["slow"])
        leased = await vq.lease(q, "w", visibility_ms=300)
        assert [r.text for r in leased] == ["slow"]
        started = time.monotonic()
        page = await vq.read(dlq, wait_ms=10_000)
        assert [r.text for r in page.records] == ["slow"]
        assert page.records[0].headers["vq-dlq-reason"] == "lease expired"
        # Due 300 ms after the lease; a tick (20 ms) and a write later, not at a next lease.
        assert time.monotonic() - started < 5
        info = await vq.queue_info(q)
        assert info is not None and info["consumers"][0]["dead_lettered"] == 1


async def test_per_key_order_holds_under_eight_workers(node):
    q = qname("keyed")
    async with AsyncClient(node.url) as vq:
        keys = [f"k{i}" for i in range(10)]
        for round_ in range(20):
            for k in keys:
                await fill(vq, q, [f"{k}:{round_}"], key=k)
        order: dict[str, list[int]] = defaultdict(list)
        active: set[str] = set()
        overlaps = []

        async def handle(lease):
            key = lease.headers["vq-ordering-key"]
            if key in active:
                overlaps.append(key)
            active.add(key)
            await asyncio.sleep(0.002)
            order[key].append(int(lease.text.split(":")[1]))
            active.discard(key)

        worker = Worker(vq, q, "w", handle, concurrency=8, wait_ms=200)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 60
        while sum(map(len, order.values())) < 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await worker.stop()
        await runner
        assert overlaps == []
        assert {k: v for k, v in order.items()} == {k: list(range(20)) for k in keys}


async def test_a_delayed_retry_is_not_delivered_before_its_time(node):
    q = qname("delay")
    async with AsyncClient(node.url) as vq:
        await fill(vq, q, ["x"])
        lease = (await vq.lease(q, "w"))[0]
        await vq.retry(q, "w", lease, delay_ms=1500, reason="not yet")
        retried_at = time.monotonic()
        info = await vq.queue_info(q)
        assert info is not None and info["consumers"][0]["delayed"] == 1
        again = await vq.lease(q, "w", wait_ms=5000)
        waited = time.monotonic() - retried_at
        assert [x.attempt for x in again] == [2]
        assert waited >= 1.45, waited  # scheduling jitter only


def test_bad_input_gets_the_registrys_json_errors(node):
    q = qname("bad")
    base = f"{node.url}/v1/queues/{q}/consumers/w"
    http("POST", f"{node.url}/v1/queues/{q}/records", {"records": [{"value": "x"}]})
    status, leased = http("POST", f"{base}/lease", {"max_records": 1})
    assert status == 200
    token = leased["records"][0]["token"]
    cases = [
        ("POST", "/complete", {"tokens": ["not-a-token"]}, 400, "invalid_token"),
        ("POST", "/complete", {"tokens": []}, 400, "invalid_token"),
        ("POST", "/complete", {"tokens": ["999999.1"]}, 409, "lease_expired"),
        ("POST", "/retry", {"tokens": [token], "delay_ms": -1}, 400, "limit_out_of_range"),
        ("POST", "/retry", {"tokens": [token], "delay_ms": "soon"}, 400, "invalid_parameter"),
        ("POST", "/extend", {"tokens": [token], "visibility_ms": 5}, 400, "limit_out_of_range"),
        ("POST", "/lease", {"visibility_ms": 10**12}, 400, "limit_out_of_range"),
        ("POST", "/lease", {"max_records": 0}, 400, "limit_out_of_range"),
        ("PUT", "", {"mode": "fifo"}, 400, "invalid_parameter"),
        ("PUT", "", {"max_attempts": 0}, 400, "limit_out_of_range"),
        ("PUT", "", {"dead_letter_queue": q}, 400, "invalid_parameter"),
        ("POST", "/ack", {"offset": 0}, 409, "consumer_mode_mismatch"),
    ]
    for method, path, body, want_status, code in cases:
        status, out = http(method, base + path, body)
        assert (status, out["error"]["code"]) == (want_status, code), (path, body, out)
        assert out["error"]["retriable"] is False
    # Nothing above changed the lease: it still completes.
    status, out = http("POST", f"{base}/complete", {"tokens": [token]})
    assert status == 200 and out["done"] == [token]


def test_consumer_settings_are_kept_and_shown(node):
    q = qname("settings")
    base = f"{node.url}/v1/queues/{q}/consumers/w"
    status, out = http("PUT", base, {"mode": "lease", "max_attempts": 7,
                                     "dead_letter_queue": "dead", "visibility_ms": 2000})
    assert status == 200
    assert (out["mode"], out["max_attempts"], out["dead_letter_queue"], out["visibility_ms"]) \
        == ("lease", 7, "dead", 2000)
    status, out = http("PUT", base, {"max_attempts": 2})
    assert (out["max_attempts"], out["dead_letter_queue"], out["visibility_ms"]) == \
        (2, "dead", 2000)
    status, got = http("GET", base)
    assert status == 200 and got == out
    assert http("GET", f"{node.url}/v1/queues/{q}/consumers/nobody")[0] == 404


async def test_the_python_client_sets_every_consumer_setting(node):
    """`configure_consumer` takes the cap and the grants' choice too; left out, they keep."""
    q = qname("client-settings")
    async with AsyncClient(node.url) as vq:
        out = await vq.configure_consumer(q, "w", mode="lease", max_in_flight=3,
                                          durable_grants=True)
        assert (out["max_in_flight"], out["durable_grants"]) == (3, True)
        out = await vq.configure_consumer(q, "w", max_attempts=4)
        assert (out["max_in_flight"], out["durable_grants"], out["max_attempts"]) == (3, True, 4)
        out = await vq.configure_consumer(q, "w", max_in_flight=None, durable_grants=False)
        assert (out["max_in_flight"], out["durable_grants"]) == (None, False)
        assert await vq.consumer_settings(q, "w") == out
        prefix = qname("client-prefix")
        out = await vq.configure_prefix_consumer("pw", prefix, durable_grants=True)
        assert out["durable_grants"] is True
        await vq.delete_prefix_consumer("pw")


@pytest.mark.both_brokers
def test_a_sigkilled_node_loses_no_completion_and_regresses_no_attempt(bootstrap):
    t = create_topics(bootstrap, partitions=4)
    q = "killed-jobs"
    node = NodeProcess(t).start()
    base = f"{node.url}/v1/queues/{q}/consumers/w"
    completed: set[int] = set()
    attempts: dict[int, int] = {}
    try:
        # Today's promise (no attempt count moves back) is the durable_grants choice's; the
        # default's bounds: tests/unit/work/test_lease_state_model.py.
        assert http("PUT", base, {"mode": "lease", "durable_grants": True})[0] == 200
        http("POST", f"{node.url}/v1/queues/{q}/records",
             {"records": [{"value": f"j{i}"} for i in range(300)]})
        for _ in range(20):
            status, page = http("POST", f"{base}/lease", {"max_records": 10,
                                                          "visibility_ms": 600})
            assert status == 200
            recs = page["records"]
            for r in recs:
                attempts[r["offset"]] = r["attempt"]
            # Complete two thirds, leave the rest to expire (attempt 1 is recorded).
            done = [r for i, r in enumerate(recs) if i % 3]
            status, _ = http("POST", f"{base}/complete", {"tokens": [r["token"] for r in done]})
            assert status == 200
            completed.update(r["offset"] for r in done)
    finally:
        assert node.kill() == -9
    node = NodeProcess(t, port=node.port).start()
    base = f"{node.url}/v1/queues/{q}/consumers/w"
    try:
        time.sleep(0.7)  # the leases left behind have expired by now
        seen: set[int] = set()
        for _ in range(100):
            status, page = http("POST", f"{base}/lease", {"max_records": 50})
            assert status == 200
            if not page["records"]:
                break
            for r in page["records"]:
                assert r["offset"] not in completed, "a completed record came again"
                assert r["attempt"] == attempts.get(r["offset"], 0) + 1
                seen.add(r["offset"])
            http("POST", f"{base}/complete", {"tokens": [r["token"] for r in page["records"]]})
        assert len(seen) + len(completed) == 300
        _, info = http("GET", f"{node.url}/v1/queues/{q}")
        assert info["consumers"][0]["lag"] == 0
    finally:
        node.terminate()


async def test_a_stream_pushes_leased_records_under_credit_and_takes_completions(node):
    q = qname("stream")
    async with AsyncClient(node.url) as vq:
        await fill(vq, q, [f"s{i}" for i in range(25)])
    url = f"{node.url.replace('http', 'ws')}/v1/queues/{q}/consumers/w/stream?mode=lease"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"op": "credit", "n": 10})
        got: list[Any] = []
        while len(got) < 10:
            frame = await ws.receive_json(timeout=10)
            assert frame["type"] == "records"
            got += frame["records"]
        # A slow client: no more credit, no more records.
        await asyncio.sleep(0.5)
        try:
            extra = await ws.receive_json(timeout=0.3)
        except TimeoutError:
            extra = None
        assert extra is None and len(got) == 10
        await ws.send_json({"op": "complete", "id": 1, "tokens": [r["token"] for r in got]})
        result = await ws.receive_json(timeout=10)
        assert (result["type"], result["id"], len(result["result"]["done"])) == ("result", 1, 10)
        await ws.send_json({"op": "credit", "n": 1})
        one = await ws.receive_json(timeout=10)
        assert [r["value"] for r in one["records"]] == ["s10"]
        await ws.send_json({"op": "complete", "id": 2, "tokens": ["bogus"]})
        err = await ws.receive_json(timeout=10)
        assert (err["type"], err["id"], err["error"]["code"]) == ("error", 2, "invalid_token")
        await ws.send_str("not json")
        err = await ws.receive_json(timeout=10)
        assert err["error"]["code"] == "malformed_json"
        await ws.send_json({"op": "ack", "id": 3, "offset": 1})  # a cursor stream's op
        err = await ws.receive_json(timeout=10)
        assert (err["id"], err["error"]["code"], err["error"]["mode"]) == (
            3, "consumer_mode_mismatch", "lease")
    # The socket dropped holding s10: it comes back once its lease ends (30 s by default), not
    # before; the rest are there at once.
    status, page = http("POST", f"{node.url}/v1/queues/{q}/consumers/w/lease",
                        {"max_records": 100})
    assert status == 200
    assert [r["value"] for r in page["records"]] == [f"s{i}" for i in range(11, 25)]


async def test_completions_on_a_streams_credit_are_durable_once_answered(bootstrap):
    t = create_topics(bootstrap, partitions=2)
    q = qname("credit-kill")
    node = NodeProcess(t).start()
    try:
        http("POST", f"{node.url}/v1/queues/{q}/records",
             {"records": [{"value": f"r{i}"} for i in range(20)]})
        url = (f"{node.url.replace('http', 'ws')}/v1/queues/{q}/consumers/w/stream"
               "?mode=lease&visibility_ms=600")
        async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
            await ws.send_json({"op": "credit", "n": 10})
            first: list[Any] = []
            while len(first) < 10:
                frame = await ws.receive_json(timeout=10)
                assert frame["type"] == "records"
                first += frame["records"]
            tokens = [r["token"] for r in first]
            await ws.send_json({"op": "credit", "n": 5, "id": 1, "complete": tokens})
            pushed: list[Any] = []
            while True:
                frame = await ws.receive_json(timeout=10)
                if frame["type"] == "result":
                    break
                assert frame["type"] == "records", frame  # the credit's may come first
                pushed += frame["records"]
            assert (frame["id"], frame["op"], frame["result"]) == (
                1, "credit", {"completed": tokens, "refused": []})
    finally:
        assert node.kill() == -9  # right after the answer: nothing flushed on the way out
    node = NodeProcess(t, port=node.port).start()
    try:
        await asyncio.sleep(0.7)  # the leases the socket left behind have expired
        seen: list[str] = []
        for _ in range(10):
            status, page = http("POST", f"{node.url}/v1/queues/{q}/consumers/w/lease",
                                {"max_records": 50})
            assert status == 200
            if not page["records"]:
                break
            seen += [r["value"] for r in page["records"]]
        assert sorted(seen, key=lambda v: int(v[1:])) == [f"r{i}" for i in range(10, 20)]
        _, info = http("GET", f"{node.url}/v1/queues/{q}")
        assert info["consumers"][0]["offset"] == first[-1]["offset"] + 1
    finally:
        node.terminate()


async def test_a_cursor_stream_pushes_from_the_committed_offset_and_takes_acks(node):
    q = qname("cstream")
    async with AsyncClient(node.url) as vq:
        await fill(vq, q, ["c0", "c1", "c2"])
    url = f"{node.url.replace('http', 'ws')}/v1/queues/{q}/consumers/r/stream"
    async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
        await ws.send_json({"op": "credit", "n": 2})
        frame = await ws.receive_json(timeout=10)
        assert [r["value"] for r in frame["records"]] == ["c0", "c1"]
        await ws.send_json({"op": "ack", "id": "a", "offset": frame["records"][-1]["offset"] + 1})
        ack = await ws.receive_json(timeout=10)
        assert ack["type"] == "result" and ack["id"] == "a"
        await ws.send_json({"op": "complete", "id": "b", "tokens": ["0.1"]})  # a lease op
        err = await ws.receive_json(timeout=10)
        assert (err["id"], err["error"]["code"], err["error"]["mode"]) == (
            "b", "consumer_mode_mismatch", "cursor")
        await ws.send_json({"op": "credit", "n": 1})  # the stream goes on
        frame = await ws.receive_json(timeout=10)
        assert [r["value"] for r in frame["records"]] == ["c2"]
    status, info = http("GET", f"{node.url}/v1/queues/{q}")
    assert status == 200
    assert info["consumers"][0]["lag"] == 1 and info["consumers"][0]["mode"] == "cursor"


def test_a_zombie_owners_late_write_is_fenced_off_on_the_next_replay(bootstrap):
    from confluent_kafka import Producer

    from vqueues.records import DeliveryUpdated, encode_offset_entry, generation_header

    t = create_topics(bootstrap, partitions=2)
    q = "fenced-jobs"
    node = NodeProcess(t).start()
    base = f"{node.url}/v1/queues/{q}/consumers/w"
    try:
        http("POST", f"{node.url}/v1/queues/{q}/records", {"records": [{"value": "x"}]})
        status, page = http("POST", f"{base}/lease", {"visibility_ms": 60_000})
        assert status == 200
        rec = page["records"][0]
        partition = _partition_of(node, q)
        # An owner of an older generation (a zombie) writes, after this node's fence, a state
        # that would hand the leased record out again at once.
        key, value = encode_offset_entry(DeliveryUpdated(q, "w", rec["offset"], 0, 0, False))
        producer = Producer({"bootstrap.servers": bootstrap})
        producer.produce(t.offsets, key=key, value=value, partition=partition,
                         headers=list(generation_header(0)))
        assert producer.flush(10) == 0
    finally:
        assert node.kill() == -9
    node = NodeProcess(t, port=node.port).start()
    try:
        status, page = http("POST", f"{node.url}/v1/queues/{q}/consumers/w/lease", {})
        assert status == 200 and page["records"] == []  # still leased until its deadline
        _, info = http("GET", f"{node.url}/v1/queues/{q}")
        assert info["consumers"][0]["in_flight"] == 1
    finally:
        node.terminate()


def _partition_of(node: NodeProcess, queue: str) -> int:
    _, info = http("GET", f"{node.url}/v1/queues/{queue}")
    return int(info["partition"])


async def test_a_worker_stopped_without_finishing_gives_its_records_back_at_once(node):
    q = qname("giveback")
    async with AsyncClient(node.url) as vq:
        await fill(vq, q, ["a", "b"])
        started = asyncio.Event()

        async def forever(lease):
            started.set()
            await asyncio.sleep(3600)

        worker = Worker(vq, q, "w", forever, concurrency=2, visibility_ms=60_000, wait_ms=200)
        runner = asyncio.create_task(worker.run())
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(0.3)  # both slots hold a record
        await worker.stop(finish=False)
        await runner
        again = await vq.lease(q, "w", max_records=2)  # not after 60 s: now
        assert sorted((x.text, x.attempt) for x in again) == [("a", 2), ("b", 2)]


def test_the_blocking_client_runs_a_worker_with_a_plain_function(node):
    import threading

    from vqueues_client import Client

    q = qname("sync")
    done: list[str] = []
    stop = threading.Event()
    with Client(node.url) as vq:
        vq.configure_consumer(q, "w", mode="lease", visibility_ms=5000)
        vq.enqueue(q, [f"v{i}" for i in range(5)])

        def handle(lease):
            done.append(lease.text)
            if len(done) == 5:
                stop.set()

        vq.work(q, "w", handle, stop, concurrency=2, wait_ms=200)
        assert sorted(done) == [f"v{i}" for i in range(5)]
        info = vq.queue_info(q)
        assert info is not None and info["consumers"][0]["lag"] == 0
        assert known(vq.consumer_settings(q, "w"))["visibility_ms"] == 5000


class CountingClient(AsyncClient):
    """Counts the work calls a Worker makes."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.calls: Counter[str] = Counter()

    async def lease(self, *args, **kw):
        self.calls["lease"] += 1
        return await super().lease(*args, **kw)

    async def complete(self, *args, **kw):
        self.calls["complete"] += 1
        return await super().complete(*args, **kw)

    async def extend(self, *args, **kw):
        self.calls["extend"] += 1
        return await super().extend(*args, **kw)


async def test_a_worker_leases_ahead_and_completes_in_batches(node):
    q = qname("batched")
    async with CountingClient(node.url) as vq:
        await fill(vq, q, [f"r{i}" for i in range(600)])
        done: list[str] = []

        async def handle(lease):
            done.append(lease.text)

        worker = Worker(vq, q, "w", handle, concurrency=8, wait_ms=200)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 30
        while len(done) < 600 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await worker.stop()
        await runner
        assert sorted(done) == sorted(f"r{i}" for i in range(600))
        assert worker.completed == 600
        # Leases of up to 100 records (80 to 240 leased ahead of 8 slots), completions gathered
        # a few ms at a time: far fewer calls than records, and no extend for a quick handler.
        assert vq.calls["lease"] < 150 and vq.calls["complete"] < 300
        assert vq.calls["extend"] == 0
        info = await vq.queue_info(q)
        assert info is not None and info["consumers"][0]["lag"] == 0


async def test_a_worker_extends_only_the_lease_of_a_slow_handler(node):
    q = qname("slowone")
    async with CountingClient(node.url) as vq:
        await fill(vq, q, ["slow"] + [f"quick{i}" for i in range(20)])
        seen: Counter[str] = Counter()

        async def handle(lease):
            seen[lease.text] += 1
            if lease.text == "slow":
                await asyncio.sleep(2.5)  # twice its visibility

        worker = Worker(vq, q, "w", handle, concurrency=4, visibility_ms=1200, wait_ms=200)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 20
        while worker.completed < 21 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await worker.stop()
        await runner
        assert seen["slow"] == 1 and all(n == 1 for n in seen.values())  # never redelivered
        # The slow one was extended (at least twice over 2.5 s); the quick ones never were.
        assert 2 <= vq.calls["extend"] <= 8


async def test_a_worker_on_several_idle_queues_long_polls_instead_of_spinning(node):
    queues = [qname(f"idle{i}") for i in range(3)]
    async with CountingClient(node.url) as vq:
        got: list[tuple[str, float]] = []

        async def handle(lease):
            got.append((lease.text, time.monotonic()))

        worker = Worker(vq, queues, "w", handle, concurrency=2, wait_ms=500)
        runner = asyncio.create_task(worker.run())
        await asyncio.sleep(1.5)
        idle_calls = vq.calls["lease"]
        sent = time.monotonic()
        await fill(vq, queues[2], ["late"])
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await worker.stop()
        await runner
        # 1.5 s idle over 3 queues at 500 ms a poll: about 3 polls each (a 50 ms sleep loop
        # made 30 each), and the record arriving meanwhile answered a parked poll at once.
        assert idle_calls <= 15
        assert [t for t, _ in got] == ["late"] and got[0][1] - sent < 0.4


async def test_a_worker_completes_on_its_leases_and_alone_only_at_the_end(node):
    q = qname("riding")
    async with CountingClient(node.url) as vq:
        await fill(vq, q, [f"r{i}" for i in range(1500)])
        seen: Counter[str] = Counter()

        async def handle(lease):
            seen[lease.text] += 1

        # A long delay: while busy, only the next lease takes finished tokens.
        worker = Worker(vq, q, "w", handle, concurrency=8, wait_ms=200,
                        complete_delay_ms=30_000)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 60
        while len(seen) < 1500 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await worker.stop()
        await runner
        assert len(seen) == 1500 and set(seen.values()) == {1}
        assert worker.completed == 1500 and worker.refused == 0
        # One call per cycle: the standalone complete at most once, for the stop.
        assert vq.calls["complete"] <= 1 and vq.calls["lease"] < 150
        info = await vq.queue_info(q)
        assert info is not None
        (w,) = info["consumers"]
        assert (w["lag"], w["in_flight"]) == (0, 0)
        assert w["offset"] == info["last_offset"] + 1
