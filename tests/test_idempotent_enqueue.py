"""Idempotent enqueue against the real broker: concurrent repeats write once, a retry answered by
a new owner after a SIGKILL writes nothing, the window expires as documented, bad keys are 400."""

import asyncio
import time
import uuid

from vqueues_client import AsyncClient, NewRecord, VQError

from tests.narrow import known
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
            assert exc.details["first_offset"] == known(results[0].offsets)[0]
        mixed = await vq.enqueue(q, [NewRecord("payload", idempotency_key="k-1"),
                                     NewRecord("new", idempotency_key="k-2"), "plain"])
        assert mixed.offsets is not None and mixed.offsets[0] == known(results[0].offsets)[0]
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


SNAPSHOT_EVERY_S = {"VQ_SNAPSHOT_INTERVAL_S": "1", "VQ_SNAPSHOT_MIN_RECORDS": "1"}


def test_a_key_survives_a_restart_that_loads_a_snapshot_taken_after_it(bootstrap):
    """The reproduction of issue 32: a key written, a snapshot taken, the node restarted in
    place (SIGTERM, start again): the same key and payload answer the first offset."""
    from tests.support import events, wait_for

    t = create_topics(bootstrap, partitions=1)
    q = qname("snap-key")
    body = {"records": [{"value": "once", "idempotency_key": "order-9"}]}
    node = NodeProcess(t, extra_env=SNAPSHOT_EVERY_S).start()
    try:
        status, first = http("POST", f"{node.url}/v1/queues/{q}/records", body)
        assert status == 200
        http("POST", f"{node.url}/v1/queues/{q}/records", {"records": [{"value": "later"}]})
        wait_for(lambda: any(e["data_position"] > first["offsets"][0]
                             for e in events(node, "snapshot_written")))
        node.terminate()
        node.start()
        loaded = events(node, "snapshot_loaded")
        assert loaded and loaded[-1]["data_position"] > first["offsets"][0]
        assert loaded[-1]["keys"] == 1  # the window came with the snapshot
        status, again = http("POST", f"{node.url}/v1/queues/{q}/records", body)
        assert status == 200 and again["offsets"] == first["offsets"]
        _, info = http("GET", f"{node.url}/v1/queues/{q}")
        assert info["records"] == 2
    finally:
        node.terminate()


def test_keyed_scheduled_retries_compare_the_schedule_as_given(node):
    q = qname("sched-key")
    url = f"{node.url}/v1/queues/{q}/records"
    at = {"value": "v", "idempotency_key": "at", "deliver_at": int(time.time() * 1000) + 300}
    delay = {"value": "v", "idempotency_key": "delay", "delay_ms": 300}
    _, first_at = http("POST", url, {"records": [at]})
    _, first_delay = http("POST", url, {"records": [delay]})
    for _ in range(2):  # before the due time, and after it (the records were delivered)
        assert http("POST", url, {"records": [at]}) == (200, first_at)
        assert http("POST", url, {"records": [delay]}) == (200, first_delay)
        time.sleep(0.8)
    _, page = http("GET", f"{url}?offset=0&limit=100")
    assert [r["value"] for r in page["records"]] == ["v", "v"]  # each delivered once
    status, refused = http("POST", url, {"records": [{**delay, "delay_ms": 301}]})
    assert status == 409 and refused["error"]["first_offset"] == first_delay["offsets"][0]


def test_a_key_repeated_in_one_request_with_another_payload_writes_nothing(node):
    q = qname("in-request")
    status, body = http("POST", f"{node.url}/v1/queues/{q}/records", {"records": [
        {"value": "e", "idempotency_key": "k5"}, {"value": "plain"},
        {"value": "f", "idempotency_key": "k5"}]})
    assert status == 409
    assert body["error"]["code"] == "idempotency_key_reused" and not body["error"]["retriable"]
    assert (body["error"]["index"], body["error"]["first_index"]) == (2, 0)
    assert body["error"]["first_offset"] is None
    status, _ = http("GET", f"{node.url}/v1/queues/{q}")
    assert status == 404  # nothing of the request was written
