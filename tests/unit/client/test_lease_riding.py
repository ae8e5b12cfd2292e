"""Completions riding on the next lease (docs/work-queues.md, "One round trip per cycle"): the
client's `lease(..., complete=...)` and the `Worker` that uses it, against a small fake node on
loopback that counts its requests (unit tier; tests/test_work_queues.py runs a real node)."""

import asyncio
import time
from collections import Counter
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from vqueues_client import AsyncClient, Client, Lease, Refused, Worker


class FakeWorkNode:
    """The work routes of one node owning every queue: records `"{queue}:{i}"`, tokens
    `"{queue}.{i}.{attempt}"`. A lease's `complete` is answered token by token (`expired`:
    tokens it refuses as `lease_expired`; `elsewhere`: as `wrong_node`, prefix leases only, and
    the map then names the node by another URL, `moved`); a standalone complete is all or
    nothing. `fail_leases` leases fail (500) before doing anything. A long poll waits until
    `wake` is set or its time is up."""

    def __init__(self) -> None:
        self.queues: dict[str, list[int]] = {}  # records not leased, by queue
        self.leased: dict[tuple[str, str], int] = {}  # (queue, token) -> offset
        self.done: Counter[tuple[str, int]] = Counter()  # completions, per record
        self.requests: Counter[str] = Counter()
        self.rides: list[Any] = []  # each lease's `complete`, as received
        self.expired: set[str] = set()
        self.elsewhere: set[str] = set()
        self.fail_leases = 0
        self.old = False  # a node from before completions rode on leases: 400 on `complete`
        self.moved = False
        self.wake = asyncio.Event()
        self.arrived = asyncio.Event()
        app = web.Application()
        app.router.add_get("/v1/partitions", self.partitions)
        app.router.add_post("/v1/queues/{queue}/consumers/{consumer}/lease", self.lease)
        app.router.add_post("/v1/queues/{queue}/consumers/{consumer}/complete", self.complete)
        app.router.add_post("/v1/prefix-consumers/{consumer}/lease", self.lease_prefix)
        app.router.add_post("/v1/prefix-consumers/{consumer}/complete", self.complete_prefix)
        self.server = TestServer(app, host="127.0.0.1")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def fill(self, queue: str, n: int) -> None:
        have = self.queues.setdefault(queue, [])
        start = len(have) + sum(1 for q, _ in self.leased if q == queue)
        have.extend(range(start, start + n))
        self.arrived.set()

    async def partitions(self, request: web.Request) -> web.Response:
        url = self.url.replace("127.0.0.1", "localhost") if self.moved else self.url
        return web.json_response({"partitions": 1, "generation": 1,
                                  "owners": {"0": {"node": "n", "url": url}}})

    def _complete_one(self, queue: str, token: str, prefix: bool) -> str | None:
        """The code a riding token is refused with, or None once it is done."""
        if prefix and token in self.elsewhere:
            self.elsewhere.discard(token)
            self.moved = True  # its owner: this fake again, by another URL
            return "wrong_node"
        if token in self.expired:
            return "lease_expired"
        offset = self.leased.get((queue, token))
        if offset is None:
            return "invalid_token"
        self.done[(queue, offset)] += 1  # (a repeat too: the tests count every completion)
        return None

    async def _grant(self, queues: list[str], body: dict[str, Any]
                     ) -> list[tuple[str, dict[str, Any]]]:
        max_records, wait_ms = body.get("max_records", 1), body.get("wait_ms", 0)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            out: list[tuple[str, dict[str, Any]]] = []
            for q in queues:
                while self.queues.get(q) and len(out) < max_records:
                    offset = self.queues[q].pop(0)
                    token = f"{q}.{offset}.1"
                    self.leased[(q, token)] = offset
                    out.append((q, {"offset": offset, "timestamp": 0, "value": f"{q}:{offset}",
                                    "headers": {}, "token": token, "attempt": 1,
                                    "deadline": int(time.time() * 1000) + 30_000}))
            left = deadline - time.monotonic()
            if out or left <= 0 or self.wake.is_set():
                return out
            self.arrived.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self.arrived, self.wake)]
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()

    def _failed(self) -> web.Response | None:
        if self.fail_leases:
            self.fail_leases -= 1
            return web.json_response({"error": {"code": "internal_error", "message": "boom",
                                                "retriable": False}}, status=500)
        return None

    async def lease(self, request: web.Request) -> web.Response:
        self.requests["lease"] += 1
        queue = request.match_info["queue"]
        body = await request.json()
        self.rides.append(body.get("complete"))
        failed = self._failed()
        if failed is not None:
            return failed
        if self.old and "complete" in body:
            return web.json_response({"error": {
                "code": "invalid_parameter", "message": "unknown field(s) ['complete']",
                "retriable": False, "unknown": ["complete"]}}, status=400)
        answer: dict[str, Any] = {}
        if "complete" in body:
            answer = {"completed": [], "refused": []}
            for token in body["complete"]:
                code = self._complete_one(queue, token, prefix=False)
                if code is None:
                    answer["completed"].append(token)
                else:
                    answer["refused"].append({"token": token, "code": code})
        records = [r for _, r in await self._grant([queue], body)]
        return web.json_response({"partition": 0, "records": records, **answer})

    async def lease_prefix(self, request: web.Request) -> web.Response:
        self.requests["lease_prefix"] += 1
        body = await request.json()
        self.rides.append(body.get("complete"))
        failed = self._failed()
        if failed is not None:
            return failed
        answer: dict[str, Any] = {}
        if "complete" in body:
            answer = {"completed": [], "refused": []}
            for item in body["complete"]:
                code = self._complete_one(item["queue"], item["token"], prefix=True)
                if code is None:
                    answer["completed"].append(item)
                else:
                    answer["refused"].append({**item, "code": code})
        got = await self._grant(sorted(self.queues), body)
        return web.json_response({"consumer": request.match_info["consumer"], "records": [
            {**r, "queue": q, "partition": 0} for q, r in got], **answer})

    def _complete_all(self, pairs: list[tuple[str, str]]) -> web.Response:
        stale = [(q, t) for q, t in pairs if t in self.expired]
        if stale:
            return web.json_response({"error": {
                "code": "lease_expired", "message": "stale", "retriable": False,
                "stale": [{"queue": q, "token": t} for q, t in stale]}}, status=409)
        for q, t in pairs:
            if self._complete_one(q, t, prefix=False) is not None:
                raise AssertionError(f"unknown token {t}")
        return web.json_response({"done": [t for _, t in pairs]})

    async def complete(self, request: web.Request) -> web.Response:
        self.requests["complete"] += 1
        queue = request.match_info["queue"]
        tokens = (await request.json())["tokens"]
        if any(t in self.expired for t in tokens):
            return web.json_response({"error": {
                "code": "lease_expired", "message": "stale", "retriable": False,
                "stale": [t for t in tokens if t in self.expired]}}, status=409)
        return self._complete_all([(queue, t) for t in tokens])

    async def complete_prefix(self, request: web.Request) -> web.Response:
        self.requests["complete_prefix"] += 1
        items = (await request.json())["tokens"]
        return self._complete_all([(x["queue"], x["token"]) for x in items])

    def completions(self) -> Counter[tuple[str, int]]:
        return +self.done


@pytest.fixture
async def fake():
    node = FakeWorkNode()
    await node.server.start_server()
    yield node
    node.wake.set()
    await node.server.close()


async def test_a_lease_carries_completions_and_answers_each_token(fake):
    fake.fill("q", 5)
    async with AsyncClient(fake.url) as vq:
        first = await vq.lease("q", "c", max_records=3)
        assert isinstance(first, list) and first.completed == [] and first.refused == []
        fake.expired.add(first[2].token)
        finished: list[Lease | str] = [first[0], first[1].token, first[2], "junk"]
        page = await vq.lease("q", "c", max_records=2, complete=finished)
    assert [x.text for x in page] == ["q:3", "q:4"]
    assert page.completed == [first[0].token, first[1].token]
    assert page.refused == [Refused(first[2].token, "lease_expired"),
                            Refused("junk", "invalid_token")]
    assert fake.rides == [None, [first[0].token, first[1].token, first[2].token, "junk"]]
    assert fake.completions() == {("q", 0): 1, ("q", 1): 1}
    assert fake.requests["complete"] == 0


async def test_a_prefix_lease_carries_leases_or_queue_and_token_pairs(fake):
    fake.fill("t-a", 2)
    fake.fill("t-b", 1)
    async with AsyncClient(fake.url) as vq:
        first = await vq.lease_prefix("pool", fake.url, max_records=3)
        fake.expired.add(first[2].token)
        finished: list[Lease | tuple[str, str]] = [first[0], ("t-a", first[1].token), first[2]]
        page = await vq.lease_prefix("pool", fake.url, max_records=1, complete=finished)
    assert page == [] and isinstance(page, list)
    assert page.completed == [("t-a", first[0].token), ("t-a", first[1].token)]
    assert page.refused == [Refused(first[2].token, "lease_expired", "t-b")]
    assert fake.rides[1] == [{"queue": "t-a", "token": first[0].token},
                             {"queue": "t-a", "token": first[1].token},
                             {"queue": "t-b", "token": first[2].token}]


async def test_the_blocking_client_lease_takes_complete(fake):
    fake.fill("q", 2)

    def go() -> tuple[list[Lease], Any]:
        with Client(fake.url) as vq:
            first = vq.lease("q", "c")
            return first, vq.lease("q", "c", complete=first)

    first, page = await asyncio.to_thread(go)
    assert page.completed == [first[0].token] and [x.text for x in page] == ["q:1"]


async def run_until(worker: Worker, done: Any, limit_s: float = 30) -> None:
    """Run `worker` until `done()` (or `limit_s`), then stop it."""
    runner = asyncio.create_task(worker.run())
    deadline = time.monotonic() + limit_s
    while not done() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    await worker.stop()
    await runner


async def test_a_busy_worker_sends_finished_tokens_with_its_next_lease(fake):
    fake.fill("q", 2000)
    async with AsyncClient(fake.url) as vq:
        handled: list[str] = []

        async def handle(lease: Lease) -> None:
            handled.append(lease.text or "")

        # A long delay: only a lease takes the tokens while the worker is busy.
        worker = Worker(vq, "q", "w", handle, concurrency=4, wait_ms=100,
                        complete_delay_ms=60_000)
        await run_until(worker, lambda: len(fake.completions()) == 2000)
    assert fake.completions() == {("q", i): 1 for i in range(2000)}
    assert worker.completed == 2000 and sorted(handled) == sorted(f"q:{i}" for i in range(2000))
    # One call per cycle: the leases carried every completion (the last ones on a long poll,
    # or the stop's one standalone call).
    assert fake.requests["complete"] <= 1
    rode = sum(len(x) for x in fake.rides if x)
    assert rode >= 2000 - worker.capacity


async def test_an_idle_worker_completes_alone_after_the_delay_while_its_lease_waits(fake):
    fake.fill("q", 3)
    release = asyncio.Event()
    async with AsyncClient(fake.url) as vq:
        async def handle(lease: Lease) -> None:
            await release.wait()

        worker = Worker(vq, "q", "w", handle, concurrency=4, wait_ms=30_000,
                        complete_delay_ms=1000)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 20
        # The queue is empty and the leaser long-polls (30 s) when the handlers finish: no
        # lease is due, so their tokens go alone once `complete_delay_ms` has passed.
        while fake.requests["lease"] < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        release.set()
        while len(fake.completions()) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert fake.completions() == {("q", 0): 1, ("q", 1): 1, ("q", 2): 1}
        assert fake.requests["complete"] == 1 and not any(fake.rides)
        # A record answers the poll: its token rides on the next lease, sent at once.
        fake.fill("q", 1)
        while len(fake.completions()) < 4 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        fake.wake.set()
        await worker.stop()
        await runner
    assert fake.completions() == {("q", i): 1 for i in range(4)}
    assert fake.requests["complete"] == 1 and ["q.3.1"] in fake.rides


async def test_refused_completions_go_to_the_hook_token_by_token(fake):
    fake.fill("q", 40)
    fake.expired |= {"q.3.1", "q.17.1"}
    async with AsyncClient(fake.url) as vq:
        refused: list[tuple[str, str]] = []

        async def handle(lease: Lease) -> None:
            pass

        worker = Worker(vq, "q", "w", handle, concurrency=2, wait_ms=100,
                        on_refused=lambda lease, code: refused.append((lease.token, code)))
        await run_until(worker, lambda: len(fake.completions()) == 38)
    assert sorted(refused) == [("q.17.1", "lease_expired"), ("q.3.1", "lease_expired")]
    assert worker.refused == 2 and worker.completed == 38


async def test_tokens_of_a_failed_lease_are_sent_again_and_stop_completes_the_rest(fake):
    fake.fill("q", 8)
    release = asyncio.Event()
    async with AsyncClient(fake.url) as vq:
        handled: list[str | None] = []

        async def handle(lease: Lease) -> None:
            handled.append(lease.text)
            await release.wait()

        worker = Worker(vq, "q", "w", handle, concurrency=8, wait_ms=30_000, max_batch=8,
                        prefetch=0, complete_delay_ms=60_000, idle_sleep_s=0.05)
        runner = asyncio.create_task(worker.run())
        deadline = time.monotonic() + 20
        while len(handled) < 8 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        fake.fail_leases = 10_000  # every lease from now on fails
        release.set()  # the next lease carries the 8 tokens
        while len(fake.rides) < 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        await worker.stop()
        await runner
    # Each failed lease carried them again; the stop completed them, in one call.
    tokens = sorted(f"q.{i}.1" for i in range(8))
    assert fake.rides[0] is None and sorted(fake.rides[1]) == tokens
    assert sorted(fake.rides[2]) == tokens
    assert fake.completions() == {("q", i): 1 for i in range(8)}
    assert fake.requests["complete"] == 1 and worker.completed == 8


async def test_a_prefix_worker_rides_its_node_and_sends_wrong_node_ones_to_the_owner(fake):
    fake.fill("t-a", 30)
    fake.fill("t-b", 30)
    fake.elsewhere |= {"t-a.4.1", "t-b.9.1"}
    async with AsyncClient(fake.url) as vq:
        refused: list[tuple[str, str]] = []

        async def handle(lease: Lease) -> None:
            pass

        worker = Worker(vq, None, "pool", handle, prefix=True, concurrency=4, wait_ms=100,
                        complete_delay_ms=60_000,
                        on_refused=lambda lease, code: refused.append((lease.token, code)))
        await run_until(worker, lambda: len(fake.completions()) == 60)
    assert fake.completions() == {(q, i): 1 for q in ("t-a", "t-b") for i in range(30)}
    assert refused == [] and worker.completed == 60
    # The two refused as wrong_node went alone to their queue's owner in the map.
    assert fake.requests["complete_prefix"] >= 1
    assert sum(len(x) for x in fake.rides if x) >= 60 - worker.capacity


async def test_a_worker_completes_alone_on_a_node_that_takes_no_completions_on_a_lease(fake):
    """A rolling upgrade: a node from before this change refuses `complete` on a lease (400
    naming it unknown). The Worker then completes alone there, and drains the queue."""
    fake.old = True
    fake.fill("q", 300)
    async with AsyncClient(fake.url) as vq:
        async def handle(lease: Lease) -> None:
            return None

        worker = Worker(vq, "q", "w", handle, concurrency=4, wait_ms=100)
        await run_until(worker, lambda: len(fake.completions()) == 300)
    assert fake.completions() == {("q", i): 1 for i in range(300)}
    assert worker.completed == 300
    assert sum(1 for x in fake.rides if x) <= 1  # it tried once, then stopped riding
    assert fake.requests["complete"] >= 1
