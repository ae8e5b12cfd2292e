"""Scheduled records against the real broker: 1,000 records with delays over 5 s appear in due
order and none early; a node SIGKILLed with 500 pending delivers each exactly once after its
restart; cancellation; bad input."""

import random
import time
import uuid

import aiohttp
from vqueues_client import AsyncClient

from tests.narrow import known
from tests.support import NodeProcess, create_topics, http


def qname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_a_thousand_delayed_records_appear_in_due_order_and_none_early(node):
    q = qname("sched")
    rnd = random.Random(3)
    now = int(time.time() * 1000)
    dues = [now + 500 + rnd.randrange(4500) for _ in range(1000)]
    body = {"records": [{"value": str(d), "deliver_at": d} for d in dues]}
    async with aiohttp.ClientSession() as s:
        for i in range(0, 1000, 250):
            async with s.post(f"{node.url}/v1/queues/{q}/records",
                              json={"records": body["records"][i:i + 250]}) as r:
                assert r.status == 200, await r.text()
        async with s.get(f"{node.url}/v1/queues/{q}") as r:
            info = await r.json()
        assert info["scheduled"] == 1000 and info["next_due"] == min(dues)
        seen: list[tuple[int, int]] = []  # (due, seen at)
        offset = 0
        deadline = time.monotonic() + 20
        while len(seen) < 1000 and time.monotonic() < deadline:
            async with s.get(f"{node.url}/v1/queues/{q}/records",
                             params={"offset": str(offset), "limit": "1000",
                                     "wait_ms": "1000"}) as r:
                page = await r.json()
            at = int(time.time() * 1000)
            seen += [(int(x["value"]), at) for x in page["records"]]
            offset = page["next_offset"]
    assert len(seen) == 1000
    assert [d for d, _ in seen] == sorted(dues)  # due order
    early = [d - at for d, at in seen if at < d]
    assert early == [], f"{len(early)} records appeared before their due time"
    lateness = sorted(at - d for d, at in seen)
    assert lateness[len(lateness) // 2] < 1000  # p50 well under a second (about 100 ms healthy)


def test_a_node_killed_with_500_pending_delivers_each_exactly_once(bootstrap):
    t = create_topics(bootstrap, partitions=4)
    q = "sched-killed"
    node = NodeProcess(t).start()
    due = int(time.time() * 1000) + 3000
    try:
        status, out = http("POST", f"{node.url}/v1/queues/{q}/records", {
            "records": [{"value": f"s{i}", "deliver_at": due + i} for i in range(500)]})
        assert status == 200 and len(out["offsets"]) == 500
        _, info = http("GET", f"{node.url}/v1/queues/{q}")
        assert info["scheduled"] == 500 and info["records"] == 0
    finally:
        assert node.kill() == -9
    node = NodeProcess(t, port=node.port).start()
    try:
        # The restart outlasts the 3 s: the new owner finds them due and moves them at once.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _, info = http("GET", f"{node.url}/v1/queues/{q}")
            if info["scheduled"] == 0:
                break
            time.sleep(0.2)
        _, page = http("GET", f"{node.url}/v1/queues/{q}/records?offset=0&limit=1000")
        values = [r["value"] for r in page["records"]]
        assert sorted(values) == sorted(f"s{i}" for i in range(500))  # each exactly once
        assert values == [f"s{i}" for i in range(500)]  # in due order
        assert all(r["timestamp"] >= due for r in page["records"])
    finally:
        node.terminate()


async def test_cancel_and_bad_input(node):
    q = qname("cancel")
    async with AsyncClient(node.url) as vq:
        res = await vq.enqueue(q, "never", delay_ms=60_000)
        assert res.offsets is not None
        assert known(await vq.cancel_scheduled(q, res.offsets[0]))["cancelled"] is True
        assert await vq.cancel_scheduled(q, res.offsets[0]) is None  # 404: not waiting
        past = await vq.enqueue(q, "now", deliver_at=1)  # due in the past: at once
        page = await vq.read(q, offset=0)
        assert [r.text for r in page.records] == ["now"] and past.offsets
    for record, code in (({"delay_ms": 8 * 24 * 3600 * 1000}, "limit_out_of_range"),
                         ({"delay_ms": -5}, "limit_out_of_range"),
                         ({"delay_ms": 1, "deliver_at": 1}, "invalid_record"),
                         ({"deliver_at": "tomorrow"}, "invalid_record")):
        status, body = http("POST", f"{node.url}/v1/queues/{q}/records",
                            {"records": [{"value": "v", **record}]})
        assert (status, body["error"]["code"]) == (400, code), (record, body)
    status, body = http("DELETE", f"{node.url}/v1/queues/{q}/scheduled/abc")
    assert status == 400
