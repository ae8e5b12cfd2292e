"""The Python client against a small fake vqueues on loopback: order, gaps, retries."""

import asyncio
import random
import re
import socket
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from vqueues_client import AsyncClient, BatchProducer, DeadlineExceeded, NewRecord, VQError, consume
from vqueues_client.types import Value

from tests.narrow import failed_with, known


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
        self.limits: dict[str, int] | None = None  # published in the map, as a node does
        # As a node: a multi-queue body over `max_body` is 413 payload_too_large (naming no
        # record); a value over `max_record` or with a bad tag refuses the whole request,
        # naming records[i].
        self.max_body: int | None = None
        self.max_record = 1024 * 1024
        self.bodies: list[int] = []  # the multi-queue bodies' sizes, as received
        self.map_partitions = 1  # what the map says (every partition owned here)
        self.answer_partition = 0  # what an enqueue answers
        self.map_fetches = 0
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/v1/partitions", self.partitions)
        app.router.add_post("/v1/queues/{queue}/records", self.enqueue)
        app.router.add_post("/v1/records", self.enqueue_many)
        app.router.add_get("/v1/queues/{queue}/records", self.read)
        app.router.add_post("/v1/queues/{queue}/consumers/{consumer}/ack", self.ack)
        self.server = TestServer(app, host="127.0.0.1")

    def count(self, what):
        self.requests[what] = self.requests.get(what, 0) + 1

    async def partitions(self, request):
        self.map_fetches += 1
        url = str(self.server.make_url("")).rstrip("/")
        body = {"partitions": self.map_partitions, "generation": 1, "owners": {
            str(p): {"node": "n", "url": url} for p in range(self.map_partitions)}}
        if self.limits is not None:
            body["limits"] = self.limits
        return web.json_response(body)

    def refusal(self, raw: bytes, records: list[dict[str, Any]]) -> web.Response | None:
        """A node's refusal of a multi-queue request as a whole, if it has one."""
        def refuse(status: int, code: str, message: str) -> web.Response:
            return web.json_response({"error": {"code": code, "message": message,
                                                "retriable": False}}, status=status)
        if self.max_body is not None and len(raw) > self.max_body:
            return refuse(413, "payload_too_large",
                          f"request body exceeds the limit of {self.max_body} bytes")
        for i, r in enumerate(records):
            if not r["queue"]:
                return refuse(400, "invalid_name", f"records[{i}].queue name must not be empty")
        for i, r in enumerate(records):
            size = len(r["value"].encode()) if r["value"] is not None else 0
            if size > self.max_record:
                return refuse(413, "record_too_large",
                              f"records[{i}] is {size} bytes; at most {self.max_record}")
            if any("," in t for t in r.get("tags", [])):
                return refuse(400, "invalid_record", f"records[{i}].tags must not hold commas")
        return None

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
        return web.json_response({"partition": self.answer_partition, "offsets": offsets})

    async def enqueue_many(self, request):
        """The multi-queue enqueue: `fail_records` answers the next requests' records of a
        queue with an error, as a node does per record."""
        self.count("enqueue_many")
        if self.fail:
            status, body = self.fail.pop(0)
            return web.json_response(body, status=status)
        raw = await request.read()
        self.bodies.append(len(raw))
        body = await request.json()
        refused = self.refusal(raw, body["records"])
        if refused is not None:
            return refused
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


LIMITS = {"max_body_bytes": 20_000, "max_batch_records": 1000, "max_record_bytes": 4096}


async def test_the_batch_producer_keeps_each_request_within_the_body_limit_the_map_gives(fake):
    fake.limits, fake.max_body, fake.max_record = LIMITS, 20_000, 4096
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        async with BatchProducer(vq, linger_ms=50) as producer:
            sent = [producer.send_nowait(f"q{i % 10}", f"{i:04}" + "x" * 996) for i in range(100)]
            offsets = await asyncio.gather(*sent)
        assert vq.max_body_bytes == 20_000 and vq.max_record_bytes == 4096
    assert all(isinstance(o, int) for o in offsets)
    assert max(fake.bodies) <= 20_000 and len(fake.bodies) >= 5  # 100 KB in several requests
    for q in range(10):
        assert [v[:4] for x, v, _ in fake.log if x == f"q{q}"] == \
            [f"{i:04}" for i in range(q, 100, 10)]


async def test_before_knowing_the_limit_a_413_splits_the_request_and_sends_it_again(fake):
    fake.max_body = 20_000  # a limit the map does not publish (an old node, a proxy)
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        assert vq.max_body_bytes == 16 * 1024 * 1024  # the documented default, assumed
        async with BatchProducer(vq, linger_ms=50) as producer:
            sent = [producer.send_nowait(f"q{i % 10}", f"{i:04}" + "x" * 996) for i in range(100)]
            offsets = await asyncio.gather(*sent)
        assert vq.max_body_bytes < 20_000  # learnt from the 413s
        results = await vq.enqueue_many([(f"m{i % 7}", "y" * 1000) for i in range(100)])
    assert all(isinstance(o, int) for o in offsets)
    assert all(r.ok for r in results) and len(fake.log) == 200
    for q in range(10):
        assert [v[:4] for x, v, _ in fake.log if x == f"q{q}"] == \
            [f"{i:04}" for i in range(q, 100, 10)]


async def test_enqueue_many_keeps_each_call_within_the_body_limit_and_splits_on_a_413(fake):
    fake.limits, fake.max_body = LIMITS, 20_000
    items: list[tuple[str, Value | NewRecord]] = [
        (f"q{i % 10}", f"{i:04}" + "x" * 996) for i in range(100)]
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        results = await vq.enqueue_many(items)
        assert max(fake.bodies) <= 20_000
        fake.max_body = 7_000  # the node's limit fell: its 413s split the calls
        again = await vq.enqueue_many(items)
    assert all(r.ok for r in results + again), [r.error for r in results + again if r.error]
    assert fake.bodies[-1] <= 7_000
    assert [v for _, v, _ in fake.log] == [v for _, v in items] * 2


async def test_one_bad_record_in_a_producer_batch_fails_alone_named_by_its_queue(fake):
    fake.limits = {**LIMITS, "max_record_bytes": 1024 * 1024, "max_body_bytes": 4 << 20}
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        producer = BatchProducer(vq, linger_ms=50)
        good = [producer.send_nowait(f"g{i}", f"v{i}") for i in range(20)]
        too_big = producer.send_nowait("big", "x" * (1024 * 1024 + 1))
        unnamed = producer.send_nowait("", "v")
        control = producer.send_nowait("bad\x07name", "v")
        bad_tag = producer.send_nowait("tagged", "v", tags=["a,b"])
        behind = producer.send_nowait("tagged", "w")  # none overtakes a failed record
        await producer.flush()
    assert all(isinstance(f.result(), int) for f in good)
    assert failed_with(too_big, VQError).code == "record_too_large"
    assert "'big'" in str(too_big.exception()) and "records[" not in str(too_big.exception())
    assert failed_with(unnamed, VQError).code == "invalid_name"
    assert failed_with(control, VQError).code == "invalid_name"
    err = failed_with(bad_tag, VQError)
    assert err.code == "invalid_record" and err.status == 400 and not err.retriable
    assert "'tagged'" in err.message and not re.search(r"records\[\d+\]", err.message)
    assert failed_with(behind, VQError).code == "invalid_record"
    assert {q for q, _, _ in fake.log} == {f"g{i}" for i in range(20)}


async def test_enqueue_many_fails_only_the_bad_records_naming_their_place_in_the_list(fake):
    fake.limits = {**LIMITS, "max_record_bytes": 1024 * 1024, "max_body_bytes": 4 << 20}
    items: list[tuple[str, Value | NewRecord]] = [(f"g{i}", f"v{i}") for i in range(20)]
    items[5] = ("big", "x" * (1024 * 1024 + 1))
    items[9] = ("", "v")
    items[12] = ("tagged", NewRecord("v", tags=["a,b"]))
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        results = await vq.enqueue_many(items)
    bad = {i: known(r.error) for i, r in enumerate(results) if not r.ok}
    assert sorted(bad) == [5, 9, 12]
    assert (bad[5].code, bad[9].code, bad[12].code) == \
        ("record_too_large", "invalid_name", "invalid_record")
    assert all(f"records[{i}]" in bad[i].message for i in bad)
    assert [v for _, v, _ in fake.log] == [v for i, (_, v) in enumerate(items) if i not in bad]


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_calls_retry_until_the_deadline_while_no_node_answers():
    async with AsyncClient("http://127.0.0.1:1", deadline_s=0.5, backoff_initial_s=0.01) as vq:
        with pytest.raises(DeadlineExceeded) as raised:
            await vq.enqueue("q", "x")
        assert raised.value.last is not None and raised.value.last.code == "no_node_reachable"
        results = await vq.enqueue_many([("q", "x")])
        assert results[0].error is not None and results[0].error.code == "deadline_exceeded"
        producer = BatchProducer(vq, linger_ms=1)
        sent = producer.send_nowait("q", "x")
        await producer.flush()
        assert failed_with(sent, VQError).code == "deadline_exceeded"


async def test_a_node_that_starts_answering_within_the_deadline_gets_the_records():
    port = _unused_port()
    async with AsyncClient(f"http://127.0.0.1:{port}", deadline_s=30,
                           backoff_initial_s=0.01, backoff_max_s=0.1) as vq:
        producer = BatchProducer(vq, linger_ms=1)
        calls = asyncio.gather(vq.enqueue("q", "a"), vq.enqueue_many([("r", "b")]),
                               producer.send("s", "c"))
        await asyncio.sleep(0.3)  # every call has found no node by now
        node = FakeNode()
        node.server = TestServer(node.server.app, host="127.0.0.1", port=port)
        await node.server.start_server()
        try:
            single, many, offset = await asyncio.wait_for(calls, 20)
        finally:
            await node.server.close()
    assert single.offsets is not None and many[0].ok and isinstance(offset, int)
    assert sorted(v for _, v, _ in node.log) == ["a", "b", "c"]


async def test_an_answer_from_a_partition_past_the_maps_count_refreshes_the_map(fake):
    """After a growth (docs/growing.md) a node answers from a partition the client's map does
    not have: the client fetches the map again rather than route by the old count for up to
    `refresh_interval_s`."""
    async with AsyncClient(str(fake.server.make_url(""))) as vq:
        await vq.enqueue("q", "a")
        assert vq.partitions == 1
        fetched = fake.map_fetches
        await vq.enqueue("q", "b")  # an answer within the map's count: no fetch
        assert fake.map_fetches == fetched
        fake.map_partitions, fake.answer_partition = 2, 1
        await vq.enqueue("q", "c")
        assert vq.partitions == 2
        assert fake.map_fetches == fetched + 1
