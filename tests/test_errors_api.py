"""Bad input gets a clear JSON error with the right status, and the node keeps serving."""

import io
import json

import pytest

from tests.test_records_api import enqueue, qname, read


async def call(client, method, url, **kw):
    async with client.request(method, url, **kw) as r:
        body = await r.json()
        assert r.content_type == "application/json"
        return r.status, body


def code(body):
    return body["error"]["code"]


@pytest.mark.parametrize(("raw", "expected"), [
    (b"{not json", "malformed_json"),
    (b"[1, 2]", "malformed_json"),
    (b"", "malformed_json"),
    (b'{"records": []}', "invalid_records"),
    (b'{"records": "x"}', "invalid_records"),
    (b'{"records": [{"headers": {}}]}', "invalid_record"),
    (b'{"records": [{"value": 5}]}', "invalid_record"),
    (b'{"records": [{"value": "x", "encoding": "rot13"}]}', "invalid_record"),
    (b'{"records": [{"value": "***", "encoding": "base64"}]}', "invalid_record"),
    (b'{"records": [{"value": "x", "headers": {"a": 1}}]}', "invalid_record"),
    (b'{"records": [{"value": "x", "valeu": "typo"}]}', "invalid_record"),
])
async def test_malformed_enqueue_bodies_get_400(client, node, raw, expected):
    status, body = await call(client, "POST", f"{node.url}/v1/queues/{qname()}/records",
                              data=raw)
    assert (status, code(body)) == (400, expected)
    assert body["error"]["message"]


@pytest.mark.parametrize(("raw", "expected"), [
    (b'{}', "invalid_offset"),
    (b'{"offset": "3"}', "invalid_offset"),
    (b'{"offset": true}', "invalid_offset"),
    (b'{"offset": -1}', "invalid_offset"),
    (b'{"offset": 0, "allow_rewind": "yes"}', "invalid_parameter"),
    (b'nope', "malformed_json"),
])
async def test_malformed_acks_get_400(client, node, raw, expected):
    status, body = await call(client, "POST",
                              f"{node.url}/v1/queues/{qname()}/consumers/c/ack", data=raw)
    assert (status, code(body)) == (400, expected)


@pytest.mark.parametrize("params", [
    {"limit": "0"}, {"limit": "1001"}, {"wait_ms": "-1"}, {"wait_ms": "30001"},
    {"offset": "-5"}, {"limit": "ten"}, {"encoding": "hex"}, {"consumer": "a\x01b"},
])
async def test_read_parameters_out_of_range_get_400(client, node, params):
    status, body = await call(client, "GET", f"{node.url}/v1/queues/{qname()}/records",
                              params=params)
    assert status == 400
    assert code(body) in ("limit_out_of_range", "invalid_parameter", "invalid_name")


@pytest.mark.parametrize("name", ["x" * 250, "%01bad", "%0Anewline"])
async def test_bad_queue_names_get_400(client, node, name):
    status, body = await call(client, "GET", f"{node.url}/v1/queues/{name}/records")
    assert (status, code(body)) == (400, "invalid_name")


async def test_a_body_over_the_limit_gets_413(client, node):
    big = b'{"records": [{"value": "' + b"x" * (16 * 1024 * 1024) + b'"}]}'
    status, body = await call(client, "POST", f"{node.url}/v1/queues/{qname()}/records",
                              data=io.BytesIO(big))
    assert (status, code(body)) == (413, "payload_too_large")


async def test_a_record_over_the_limit_gets_413(client, node):
    status, body = await call(client, "POST", f"{node.url}/v1/queues/{qname()}/records",
                              data=io.BytesIO(json.dumps(
                                  {"records": [{"value": "x" * (1024 * 1024 + 1)}]}).encode()))
    assert (status, code(body)) == (413, "record_too_large")


async def test_too_many_records_in_one_request_get_400(client, node):
    status, body = await call(client, "POST", f"{node.url}/v1/queues/{qname()}/records",
                              json={"records": [{"value": "x"}] * 1001})
    assert (status, code(body)) == (400, "too_many_records")
    assert body["error"]["max"] == 1000


async def test_unknown_routes_and_methods_answer_json(client, node):
    assert (await call(client, "GET", f"{node.url}/v2/nothing"))[0] == 404
    status, body = await call(client, "PUT", f"{node.url}/v1/queues/q/records")
    assert (status, code(body)) == (405, "method_not_allowed")


async def test_the_node_keeps_serving_after_bad_input(client, node):
    q = qname()
    for _ in range(3):
        await call(client, "POST", f"{node.url}/v1/queues/{q}/records", data=b"{{{")
    await enqueue(client, node, q, "still here")
    assert [r["value"] for r in (await read(client, node, q))["records"]] == ["still here"]
