"""Acks, consumers, queue inspection, listing and deletion through real HTTP."""

import uuid
from urllib.parse import quote

from tests.http_calls import qname
from tests.support import cursor_counts, enqueue, read


async def ack(client, node, q, c, offset, **extra):
    async with client.post(f"{node.url}/v1/queues/{q}/consumers/{c}/ack",
                           json={"offset": offset, **extra}) as r:
        return r.status, await r.json()


async def test_ack_moves_the_consumer_and_zero_is_a_valid_offset(client, node):
    q = qname()
    offsets = (await enqueue(client, node, q, "a", "b"))["offsets"]
    assert await ack(client, node, q, "c", 0) == (
        200, {"queue": q, "consumer": "c", "offset": 0, "previous_offset": None})
    status, body = await ack(client, node, q, "c", offsets[1] + 1)
    assert status == 200 and body["previous_offset"] == 0
    got = await read(client, node, q, consumer="c")
    assert got["records"] == [] and got["next_offset"] == offsets[1] + 1


async def test_moving_back_needs_allow_rewind(client, node):
    q = qname()
    offsets = (await enqueue(client, node, q, "a", "b", "c"))["offsets"]
    await ack(client, node, q, "c", offsets[2])
    status, body = await ack(client, node, q, "c", offsets[0])
    assert status == 409
    assert body["error"]["code"] == "rewind_not_allowed"
    assert body["error"]["committed_offset"] == offsets[2]
    status, body = await ack(client, node, q, "c", offsets[0], allow_rewind=True)
    assert status == 200 and body["offset"] == offsets[0]
    got = await read(client, node, q, consumer="c")
    assert [r["value"] for r in got["records"]] == ["a", "b", "c"]


async def test_acking_the_same_offset_again_is_fine(client, node):
    q = qname()
    offsets = (await enqueue(client, node, q, "a"))["offsets"]
    assert (await ack(client, node, q, "c", offsets[0] + 1))[0] == 200
    assert (await ack(client, node, q, "c", offsets[0] + 1))[0] == 200


async def test_an_ack_past_the_partition_end_is_refused(client, node):
    q = qname()
    status, body = await ack(client, node, q, "c", 10**12)
    assert status == 400 and body["error"]["code"] == "offset_out_of_range"


async def test_queue_info_shows_counts_offsets_and_each_consumers_lag(client, node, topics):
    q = qname()
    offsets = (await enqueue(client, node, q, "a", "b", "c", "d"))["offsets"]
    await ack(client, node, q, "fast", offsets[3] + 1)
    await ack(client, node, q, "slow", offsets[1])
    async with client.get(f"{node.url}/v1/queues/{q}") as r:
        info = await r.json()
    assert info["records"] == 4
    assert (info["first_offset"], info["last_offset"]) == (offsets[0], offsets[3])
    assert info["consumers"] == [{"consumer": "fast", "offset": offsets[3] + 1, "lag": 0,
                                  **cursor_counts(0)},
                                 {"consumer": "slow", "offset": offsets[1], "lag": 3,
                                  **cursor_counts(3)}]


async def test_an_unknown_queue_is_404(client, node):
    async with client.get(f"{node.url}/v1/queues/{qname()}") as r:
        assert r.status == 404
        assert (await r.json())["error"]["code"] == "queue_not_found"


async def test_deleting_a_consumer_forgets_its_offset(client, node):
    q = qname()
    offsets = (await enqueue(client, node, q, "a", "b"))["offsets"]
    await ack(client, node, q, "c", offsets[1])
    async with client.delete(f"{node.url}/v1/queues/{q}/consumers/c") as r:
        assert r.status == 200 and (await r.json())["offset"] == offsets[1]
    async with client.delete(f"{node.url}/v1/queues/{q}/consumers/c") as r:
        assert r.status == 404
        assert (await r.json())["error"]["code"] == "consumer_not_found"
    got = await read(client, node, q, consumer="c")
    assert [r["value"] for r in got["records"]] == ["a", "b"]


async def test_deleting_a_queue_removes_records_and_consumers_and_the_name_starts_fresh(
        client, node):
    q = qname()
    offsets = (await enqueue(client, node, q, "old-1", "old-2"))["offsets"]
    await ack(client, node, q, "c", offsets[0] + 1)
    async with client.delete(f"{node.url}/v1/queues/{q}") as r:
        assert r.status == 200
        body = await r.json()
    assert body["records"] == 2 and body["consumers"] == ["c"]
    assert body["deleted_before"] > offsets[1]
    async with client.get(f"{node.url}/v1/queues/{q}") as r:
        assert r.status == 404
    assert (await read(client, node, q, offset=0))["records"] == []
    async with client.delete(f"{node.url}/v1/queues/{q}") as r:
        assert r.status == 404
    await enqueue(client, node, q, "new-1")
    got = await read(client, node, q, consumer="c")
    assert [r["value"] for r in got["records"]] == ["new-1"]
    async with client.get(f"{node.url}/v1/queues/{q}") as r:
        info = await r.json()
    assert info["records"] == 1 and info["consumers"] == []


async def test_queues_are_listed_by_prefix_in_pages(client, node):
    prefix = f"list-{uuid.uuid4().hex[:6]}/"
    names = sorted(f"{prefix}{i:02}" for i in range(5))
    for n in names:
        await enqueue(client, node, quote(n, safe=""), "x")
    async with client.get(f"{node.url}/v1/queues", params={"prefix": prefix, "limit": 3}) as r:
        page = await r.json()
    assert page == {"queues": names[:3], "next_after": names[2]}
    async with client.get(f"{node.url}/v1/queues",
                          params={"prefix": prefix, "after": names[2]}) as r:
        assert await r.json() == {"queues": names[3:], "next_after": None}


async def test_partitions_health_readiness_and_openapi(client, node, topics):
    async with client.get(f"{node.url}/v1/partitions") as r:
        body = await r.json()
    assert body["partitions"] == topics.partitions
    assert body["owned"] == list(range(topics.partitions)) == body["ready"]
    async with client.get(f"{node.url}/healthz") as r:
        assert r.status == 200
    async with client.get(f"{node.url}/readyz") as r:
        assert r.status == 200 and (await r.json())["status"] == "ready"
    async with client.get(f"{node.url}/v1/openapi.json") as r:
        doc = await r.json()
    assert doc["openapi"].startswith("3.")
    for path in ("/v1/queues/{queue}/records", "/v1/queues/{queue}/consumers/{consumer}/ack",
                 "/v1/queues/{queue}", "/v1/queues", "/v1/partitions", "/healthz", "/readyz"):
        assert path in doc["paths"]


def _metric(text, name, **labels):
    """A sample's value from Prometheus text, matched by name and label set (any order)."""
    want = {f'{k}="{v}"' for k, v in labels.items()}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        metric, _, raw = series.partition("{")
        if metric == name and set(filter(None, raw.rstrip("}").split(","))) == want:
            return float(value)
    return 0.0


async def test_metrics_count_requests_by_route_template_and_records(client, node, topics):
    async with client.get(f"{node.url}/metrics") as r:
        before = await r.text()
    q = qname()
    await enqueue(client, node, q, "a", "b", "c")
    await read(client, node, q)
    async with client.get(f"{node.url}/metrics") as r:
        assert r.status == 200 and r.content_type == "text/plain"
        after = await r.text()
    assert _metric(after, "vq_records_enqueued_total") - \
        _metric(before, "vq_records_enqueued_total") == 3
    assert _metric(after, "vq_records_read_total") - _metric(before, "vq_records_read_total") >= 3
    route = "/v1/queues/{queue}/records"
    assert _metric(after, "vq_http_requests_total", route=route, method="POST",
                   status="200") >= 1
    assert q not in after  # queue names never become label values
    assert _metric(after, "vq_partitions_owned") == topics.partitions
    assert _metric(after, "vq_partitions_ready") == topics.partitions
    assert _metric(after, "vq_cache_bytes") > 0


async def test_metrics_name_filter_answers_only_the_samples_named(client, node):
    async with client.get(f"{node.url}/metrics", params=[
            ("name[]", "vq_acks_total"), ("name[]", "vq_partitions_owned")]) as r:
        assert r.status == 200
        text = await r.text()
    names = {line.split("{")[0].split(" ")[0] for line in text.splitlines()
             if line and not line.startswith("#")}
    assert names == {"vq_acks_total", "vq_partitions_owned"}
