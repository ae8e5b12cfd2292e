"""Idempotent enqueue against the real broker: concurrent repeats write once, a retry answered by
a new owner after a SIGKILL writes nothing, the window expires as documented, bad keys are 400."""

import asyncio
import time
import uuid

from vqueues_client import AsyncClient, NewRecord, VQError

from tests.support import NodeProcess, create_topics, http


def qname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_the_same_key_sent_five_times_at_once_yields_one_record(node):
    q = qname("idem")
    async with AsyncClient(node.url) as vq:
        results = await asyncio.gather(*(vq.enqueue(q, "payload", idempotency_key="k-1")
                                         for _ in range(5)))
        assert len({tuple(r.offsets or ()) for r in results}) == 1
        page = await vq.read(q, offset=0, limit=100)
        assert [r.text for r in page.records] == ["payload"]
        try:
            await vq.enqueue(q, "other payload", idempotency_key="k-1")
            raise AssertionError("a reused key must be refused")
        except VQError as exc:
            assert (exc.status, exc.code) == (409, "idempotency_key_reused")
            assert exc.details["first_offset"] == results[0].offsets[0]
        mixed = await vq.enqueue(q, [NewRecord("payload", idempotency_key="k-1"),
                                     NewRecord("new", idempotency_key="k-2"), "plain"])
        assert mixed.offsets is not None and mixed.offsets[0] == results[0].offsets[0]
        page = await vq.read(q, offset=0, limit=100)
        assert [r.text for r in page.records] == ["payload", "new", "plain"]
        assert page.records[1].headers["vq-idempotency-key"] == "k-2"


def test_bad_idempotency_keys_get_json_400(node):
    for key in ("", "x" * 257, 5):
        status, body = http("POST", f"{node.url}/v1/queues/{qname('bad')}/records",
                            {"records": [{"value": "v", "idempotency_key": key}]})
        assert status == 400 and body["error"]["code"] == "invalid_record", body


def test_a_retry_answered_by_a_new_owner_after_a_sigkill_writes_no_duplicate(bootstrap):
    t = create_topics(bootstrap, partitions=4)
    q = "idem-failover"
    body = {"records": [{"value": "once", "idempotency_key": "order-7"}]}
    node = NodeProcess(t).start()
    try:
        status, first = http("POST", f"{node.url}/v1/queues/{q}/records", body)
        assert status == 200
    finally:
        assert node.kill() == -9  # as if the answer had been lost with the node
    node = NodeProcess(t, port=node.port).start()
    try:
        status, again = http("POST", f"{node.url}/v1/queues/{q}/records", body)
        assert status == 200 and again["offsets"] == first["offsets"]
        _, info = http("GET", f"{node.url}/v1/queues/{q}")
        assert info["records"] == 1
    finally:
        node.terminate()


def test_the_window_expires_as_configured(bootstrap):
    t = create_topics(bootstrap, partitions=2)
    node = NodeProcess(t, extra_env={"VQ_IDEMPOTENCY_WINDOW_MS": "1000"}).start()
    q = qname("expiry")
    body = {"records": [{"value": "v", "idempotency_key": "k"}]}
    try:
        _, first = http("POST", f"{node.url}/v1/queues/{q}/records", body)
        _, same = http("POST", f"{node.url}/v1/queues/{q}/records", body)
        assert same["offsets"] == first["offsets"]
        time.sleep(1.2)
        _, later = http("POST", f"{node.url}/v1/queues/{q}/records", body)
        assert later["offsets"][0] > first["offsets"][0]
    finally:
        node.terminate()
