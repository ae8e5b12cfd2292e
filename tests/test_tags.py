"""Tags against the real broker: a filtered read of a tag held by 3 records among 200,000 of one
queue returns them in one request; filtered leases and streams; bad tags are JSON 400s."""

import json
import uuid

import aiohttp
from vqueues_client import AsyncClient, NewRecord

from tests.support import http


def qname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def test_three_tagged_records_among_200000_come_back_in_one_request(node):
    q = qname("haystack")
    plain = json.dumps({"records": [{"value": "hay"}] * 1000})
    async with aiohttp.ClientSession() as s:
        for i in range(200):
            if i in (3, 101, 199):
                async with s.post(f"{node.url}/v1/queues/{q}/records", json={"records": [
                        {"value": f"needle-{i}", "tags": ["needle", f"n{i}"]}]}) as r:
                    assert r.status == 200
            async with s.post(f"{node.url}/v1/queues/{q}/records", data=plain,
                              headers={"Content-Type": "application/json"}) as r:
                assert r.status == 200, await r.text()
        async with s.get(f"{node.url}/v1/queues/{q}/records",
                         params={"tag": "needle", "limit": "10", "offset": "0"}) as r:
            page = await r.json()
        async with s.get(f"{node.url}/v1/queues/{q}") as r:
            info = await r.json()
    assert [x["value"] for x in page["records"]] == ["needle-3", "needle-101", "needle-199"]
    assert page["records"][0]["headers"]["vq-tags"] == "needle,n3"
    assert info["records"] == 200_003
    async with AsyncClient(node.url) as vq:
        rest = await vq.read(q, offset=page["next_offset"], tag="needle")
        assert rest.records == [] and rest.next_offset == info["last_offset"] + 1


async def test_a_filtered_lease_and_stream_see_only_their_tag(node):
    q = qname("sorted")
    async with AsyncClient(node.url) as vq:
        await vq.enqueue(q, [NewRecord("a", tags=["x"]), NewRecord("b"),
                             NewRecord("c", tags=["y", "x"]), NewRecord("d", tags=["y"])])
        leased = await vq.lease(q, "xs", max_records=10, tag="x")
        assert [x.text for x in leased] == ["a", "c"]
        await vq.complete(q, "xs", leased)
    url = f"{node.url.replace('http', 'ws')}/v1/queues/{q}/consumers/ys/stream?tag=y"
    async with aiohttp.ClientSession() as s, s.ws_connect(url) as ws:
        await ws.send_json({"op": "credit", "n": 5})
        frame = await ws.receive_json(timeout=10)
        assert [r["value"] for r in frame["records"]] == ["c", "d"]


def test_bad_tags_get_json_400(node):
    q = qname("badtag")
    for tags in (["a,b"], [""], ["x" * 65], [f"t{i}" for i in range(9)], "a"):
        status, body = http("POST", f"{node.url}/v1/queues/{q}/records",
                            {"records": [{"value": "v", "tags": tags}]})
        assert status == 400 and body["error"]["code"] == "invalid_record", (tags, body)
    status, body = http("GET", f"{node.url}/v1/queues/{q}/records?tag=a,b")
    assert status == 400 and body["error"]["code"] == "invalid_parameter"
