"""The Python client against a small fake vqueues on loopback: order, gaps, retries."""

import asyncio
import random
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from vqueues_client import AsyncClient, BatchProducer, VQError, consume


class FakeNode:
    """Answers the routes the client uses; enqueues land in arrival order, after a random
    delay, so two requests in flight for one queue can overtake each other."""

    def __init__(self) -> None:
        # (queue, value, headers) in offset order
        self.log: list[tuple[str, str, dict[str, str]]] = []
        self.requests: dict[str, int] = {}
        self.reads: list[dict[str, str]] = []
        self.acks: list[int] = []
        self.fail: list[tuple[int, dict[str, Any]]] = []
        self.fail_records: dict[str, list[Any]] = {}  # queue -> [(status, error body), times]
        app = web.Application()
        app.router.add_get("/v1/partitions", self.partitions)
        app.router.add_post("/v1/queues/{queue}/records", self.enqueue)
        app.router.add_post("/v1/records", self.enqueue_many)
        app.router.add_get("/v1/queues/{queue}/records", self.read)
        app.router.add_post("/v1/queues/{queue}/consumers/{consumer}/ack", self.ack)
        self.server = TestServer(app, host="127.0.0.1")

    def count(self, what):
        self.requests[what] = self.requests.get(what, 0) + 1

    async def partitions(self, request):
        return web.json_response({"partitions": 1, "generation": 1, "owners": {
            "0": {"node": "n", "url": str(self.server.make_url("")).rstrip("/")}}})

    async def enqueue(self, request):
        self.count("enqueue")
        if self.fail:
            status, body = self.fail.pop(0)
            return web.json_response(body, status=status)
        body = await request.json()
        await asyncio.sleep(random.uniform(0, 0.01))
        offsets = []
        for r in body["records"]:
            offsets.append(len(self.log))
            self.log.append((request.match_info["queue"], r["value"], r.get("headers", {})))
        return web.json_response({"partition": 0, "offsets": offsets})

    async def enqueue_many(self, request):
        """The multi-queue enqueue: `fail_records` answers the next requests' records of a
        queue with an error, as a node does per record."""
        self.count("enqueue_many")
        if self.fail:
            status, body = self.fail.pop(0)
            return web.json_response(body, status=status)
        body = await request.json()
        await asyncio.sleep(random.uniform(0, 0.01))
        results = []
        # As a node does: a queue's records in one request succeed or fail together.
        failing = {q for q in {r["queue"] for r in body["records"]}
                   if self.fail_records.get(q, [None, 0])[1] > 0}
        for q in failing:
            self.fail_records[q][1] -= 1
        for r in body["records"]:
            if r["queue"] in failing:
                status, error = self.fail_records[r["queue"]][0]
                results.append({"queue": r["queue"], "partition": 0, "status": status, **error})
                continue
            results.append({"queue": r["queue"], "partition": 0, "offset": len(self.log)})
            self.log.append((r["queue"], r["value"], r.get("headers", {})))
        return web.json_response({"results": results})

    async def read(self, request):
        """Records 0..9 are gone (retention): from below 10 the answer is at once, empty, with
        next_offset 10; from 10 on it long-polls for nothing."""
        self.count("read")
        self.reads.append(dict(request.query))
        start = int(request.query.get("offset", self.acks[-1] if self.acks else 0))
        if start < 10:
            return web.json_response({"partition": 0, "records": [], "next_offset": 10})
        await asyncio.sleep(int(request.query.get("wait_ms", 0)) / 1000)
        return web.json_response({"partition": 0, "records": [], "next_offset": start})

    async def ack(self, request):
        self.acks.append((await request.json())["offset"])
        return web.json_response({"offset": self.acks[-1], "previous_offset": None})


@pytest.fixture
async def fake():
    node = FakeNode()
    await node.server.start_server()
    yield node
    await node.server.close()


async def test_the_batch_producer_keeps_each_queues_send_order_whatever_the_headers(fake):
    async with (AsyncClient(str(fake.server.make_url(""))) as vq,
                BatchProducer(vq, linger_ms=1, max_batch=3) as producer):
        sent = []
        for i in range(60):
            headers = {"kind": "odd"} if i % 2 else ({"x": str(i)} if i % 3 else None)
            sent.append(producer.send_nowait("q", f"m{i}", headers))
            if i % 7 == 0:
                await asyncio.sleep(0.002)  # several batches in flight
        offsets = cast(list[int], await asyncio.gather(*sent))  # the fake answers every offset
    assert offsets == sorted(offsets) and len(set(offsets)) == 60
    assert [v for _, v, _ in fake.log] == [f"m{i}" for i in range(60)]
    assert fake.log[1][2] == {"kind": "odd"} and fake.log[0][2] == {}
    assert fake.requests["enqueue_many"] <= 60 // 3 + 10  # batched, one request per batch


async def test_the_batch_producer_sends_again_what_failed_retriably_before_anything_later(fake):
    fake.fail_records["q"] = [(503, {"error": {"code": "broker_timeout", "message": "later",
                                               "retriable": True}}), 2]
    fake.fail_records["gone"] = [(403, {"error": {"code": "forbidden", "message": "no",
                                                  "retriable": False}}), 1]
    async with AsyncClient(str(fake.server.make_url("")), backoff_initial_s=0.005) as vq:
        producer = BatchProducer(vq, linger_ms=1, max_batch=4)
        sent = []
        for i in range(40):
            sent.append(producer.send_nowait("q", f"q{i}"))
            sent.append(producer.send_nowait("other", f"o{i}"))
            if i % 5 == 0:
                await asyncio.sleep(0.002)
        refused = [producer.send_nowait("gone", "g0"), producer.send_nowait("gone", "g1")]
        await producer.flush()
    offsets = await asyncio.gather(*sent)
    assert all(isinstance(o, int) for o in offsets)
    assert [v for q, v, _ in fake.log if q == "q"] == [f"q{i}" for i in range(40)]
    assert [v for q, v, _ in fake.log if q == "other"] == [f"o{i}" for i in range(40)]
    # A record refused for good fails the queue's records behind it: none overtakes it.
    assert all(isinstance(f.exception(), VQError) for f in refused)
    assert cast(VQError, refused[0].exception()).code == "forbidden"
    assert not [q for q, _, _ in fake.log if q == "gone"]


async def test_a_failed_batch_fails_the_ones_queued_behind_it_so_none_overtakes(fake):
    fake.fail.append((400, {"error": {"code": "invalid_record", "message": "no",
                                      "retriable": False}}))
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        producer = BatchProducer(vq, linger_ms=1, max_batch=1)
        a, b = producer.send_nowait("q", "a"), producer.send_nowait("q", "b")
        await producer.flush()
    assert isinstance(a.exception(), VQError) and isinstance(b.exception(), VQError)
    assert fake.log == []


async def test_consume_acks_past_a_gap_then_long_polls_instead_of_spinning(fake):
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        stop = asyncio.Event()
        task = asyncio.create_task(consume(vq, "q", "c", lambda r: None, wait_ms=300, stop=stop))
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(task, 2)
    assert fake.acks == [10]  # moved past the records that no longer exist, once
    assert fake.requests["read"] <= 6, fake.requests  # long polls, not a hot loop


async def test_the_client_retries_what_the_server_calls_retriable_and_nothing_else(fake):
    fake.fail.append((503, {"error": {"code": "broker_timeout", "message": "later",
                                      "retriable": True}}))
    async with AsyncClient(str(fake.server.make_url("")), backoff_initial_s=0.01) as vq:
        assert (await vq.enqueue("q", "x")).offsets == [0]
        # A 503 whose body says it is not retriable is raised at once.
        fake.fail.append((503, {"error": {"code": "x", "message": "no", "retriable": False}}))
        with pytest.raises(VQError) as err:
            await vq.enqueue("q", "y")
    assert err.value.retriable is False and fake.requests["enqueue"] == 3


@pytest.mark.parametrize("records", [
    [{"queue": "q", "value": "v"}],  # the HTTP shape: would unpack into its two keys
    [("q", "v"), ("q",)],
    [(7, "v")],
    ["qv"],
])
async def test_enqueue_many_refuses_what_is_not_a_queue_and_value_pair(fake, records):
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        with pytest.raises(TypeError, match=r"records\[\d\] must be a \(queue, value\) pair"):
            await vq.enqueue_many(records)
        # A list pair is accepted like a tuple.
        assert await vq.enqueue_many([("q", "v"), ["r", "w"]]) != []  # type: ignore[list-item]
    assert fake.requests.get("enqueue_many") == 1  # only the good call was sent
    assert [(q, v) for q, v, _ in fake.log] == [("q", "v"), ("r", "w")]
