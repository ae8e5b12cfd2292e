"""Bad input gets a clear JSON error with the right status, and writes nothing: through the
node's HTTP app (`create_app`) over the in-memory node (the `api` client of
tests/unit/conftest.py). tests/test_errors_api.py keeps what needs a node process."""

import asyncio
import gzip
import io
import json
import logging
import re
import zlib
from collections.abc import Iterator

import pytest

from tests.http_calls import JSON, JSON_TYPE, call, code, post_head, qname, raw_request
from tests.narrow import known
from vqueues.logs import BadRequestLines, JsonFormatter
from vqueues.settings import Settings


@pytest.fixture
def app_settings():
    """Request bodies must arrive within one second (a slow body's test)."""
    return Settings(write_visible_timeout_ms=1000, body_timeout_ms=1000)


@pytest.fixture(scope="module", autouse=True)
def node_log() -> Iterator[io.StringIO]:
    """What the node logs while this module runs, as it logs it (vqueues/logs.py `setup`)."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    lines = BadRequestLines()
    logging.getLogger().addHandler(handler)
    logging.getLogger("aiohttp.server").addFilter(lines)
    yield out
    logging.getLogger("aiohttp.server").removeFilter(lines)
    logging.getLogger().removeHandler(handler)


def root(api) -> str:
    """The test server's URL, for raw requests."""
    return str(api.make_url("/"))


async def enqueue(api, queue, *values):
    async with api.post(f"/v1/queues/{queue}/records",
                        json={"records": [{"value": v} for v in values]}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def read(api, queue, **params):
    async with api.get(f"/v1/queues/{queue}/records", params=params) as r:
        assert r.status == 200, await r.text()
        return await r.json()


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
async def test_malformed_enqueue_bodies_get_400(api, raw, expected):
    status, body = await call(api, "POST", f"/v1/queues/{qname()}/records",
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
async def test_malformed_acks_get_400(api, raw, expected):
    status, body = await call(api, "POST",
                              f"/v1/queues/{qname()}/consumers/c/ack", data=raw)
    assert (status, code(body)) == (400, expected)


@pytest.mark.parametrize("params", [
    {"limit": "0"}, {"limit": "1001"}, {"wait_ms": "-1"}, {"wait_ms": "30001"},
    {"offset": "-5"}, {"limit": "ten"}, {"encoding": "hex"}, {"consumer": "a\x01b"},
])
async def test_read_parameters_out_of_range_get_400(api, params):
    status, body = await call(api, "GET", f"/v1/queues/{qname()}/records",
                              params=params)
    assert status == 400
    assert code(body) in ("limit_out_of_range", "invalid_parameter", "invalid_name")


@pytest.mark.parametrize("name", ["x" * 250, "%01bad", "%0Anewline"])
async def test_bad_queue_names_get_400(api, name):
    status, body = await call(api, "GET", f"/v1/queues/{name}/records")
    assert (status, code(body)) == (400, "invalid_name")


async def test_a_body_over_the_limit_gets_413(api):
    big = b'{"records": [{"value": "' + b"x" * (16 * 1024 * 1024) + b'"}]}'
    status, body = await call(api, "POST", f"/v1/queues/{qname()}/records",
                              data=io.BytesIO(big))
    assert (status, code(body)) == (413, "payload_too_large")


async def test_a_record_over_the_limit_gets_413(api):
    status, body = await call(api, "POST", f"/v1/queues/{qname()}/records",
                              data=io.BytesIO(json.dumps(
                                  {"records": [{"value": "x" * (1024 * 1024 + 1)}]}).encode()))
    assert (status, code(body)) == (413, "record_too_large")


async def test_too_many_records_in_one_request_get_400(api):
    status, body = await call(api, "POST", f"/v1/queues/{qname()}/records",
                              json={"records": [{"value": "x"}] * 1001})
    assert (status, code(body)) == (400, "too_many_records")
    assert body["error"]["max"] == 1000


async def test_unknown_routes_and_methods_answer_json(api):
    assert (await call(api, "GET", "/v2/nothing"))[0] == 404
    status, body = await call(api, "PUT", "/v1/queues/q/records")
    assert (status, code(body)) == (405, "method_not_allowed")


@pytest.mark.parametrize(("raw", "expected"), [
    (b'{"records": [{"value": "\xff\xfe"}]}', "malformed_json"),  # a string that is not UTF-8
    (b'{"records": [{"value": "x", "headers": {"k": "\xc3"}}]}', "malformed_json"),
    (b"[" * 30_000 + b"]" * 30_000, "malformed_json"),  # deep enough to break a decoder
    (b'{"records": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", "malformed_json"),
    (b'{"records": [{"value": ' + b"[" * 40 + b"]" * 40 + b"}]}", "malformed_json"),
    (b'{"records": [{"value": "a"}], "records": [{"value": "b"}]}', "malformed_json"),
    (b'{"records": [{"value": "a", "value": "b"}]}', "malformed_json"),
    (b'{"records": [{"value": "a:b", "v\\u0061lue": "c"}]}', "malformed_json"),
    (b'{"records": [{"value": "a", "headers": {"h": "1", "h": "2"}}]}', "malformed_json"),
    # An integer beyond 64 bits is malformed JSON here (docs/api.md), in any field.
    (b'{"records": [{"value": "a", "delay_ms": 1' + b"0" * 400 + b"}]}", "malformed_json"),
    (b'{"records": [{"value": "a", "delay_ms": 1' + b"0" * 15 + b"}]}", "limit_out_of_range"),
    (b'{"records": [{"value": "a"}], "extra": 1}', "invalid_parameter"),
    (b'{"records": [{"value": "a"', "malformed_json"),  # truncated
])
async def test_hostile_enqueue_bodies_get_400_and_write_nothing(api, raw, expected):
    q = qname()
    status, body = await call(api, "POST", f"/v1/queues/{q}/records", data=raw)
    assert (status, code(body), body["error"]["retriable"]) == (400, expected, False)
    status, _ = await call(api, "GET", f"/v1/queues/{q}")
    assert status == 404  # nothing was written: the queue does not exist


@pytest.mark.parametrize(("path", "raw", "expected"), [
    ("consumers/c/ack", b'{"offset": 1, "offset": 2}', "malformed_json"),
    ("consumers/c/ack", b'{"offset": 1, "extra": true}', "invalid_parameter"),
    ("consumers/c/ack", b'{"offset": "\xff"}', "malformed_json"),
    ("consumers/w/lease", b'{"max_records": 1, "extra": true}', "invalid_parameter"),
    ("consumers/w/lease", b"[" * 5_000 + b"]" * 5_000, "malformed_json"),
    ("consumers/w/complete", b'{"tokens": ["0.1.ab"], "extra": 1}', "invalid_parameter"),
    ("consumers/w/retry", b'{"tokens": "0.1"}', "invalid_token"),
    ("consumers/w/retry", b'{"tokens": ["0.1.ab"], "why": "x"}', "invalid_parameter"),
    ("consumers/w/extend", b'{"tokens": ["0.1.ab"], "visibility_ms": 1000, "x": 1}',
     "invalid_parameter"),
])
async def test_every_body_refuses_unknown_fields_and_bad_json(api, path, raw,
                                                               expected):
    status, body = await call(api, "POST", f"/v1/queues/{qname()}/{path}",
                              data=raw)
    assert (status, code(body)) == (400, expected)


async def test_settings_prefix_and_compat_bodies_refuse_unknown_fields(api):
    cases = [
        ("PUT", f"/v1/queues/{qname()}/consumers/w", {"mode": "lease", "x": 1}),
        ("PUT", "/v1/prefix-consumers/pool", {"prefix": "t-", "x": 1}),
        ("POST", "/v1/prefix-consumers/pool/lease", {"max_records": 1, "x": 1}),
        ("POST", "/get_records", {"Queue": "q", "Bogus": 1}),
        ("POST", "/consumer_ack", {"Queue": "q", "Consumer": "c", "Offset": 1, "X": 2}),
    ]
    for method, path, payload in cases:
        status, body = await call(api, method, path, json=payload)
        assert (status, code(body)) == (400, "invalid_parameter"), (path, body)
    status, body = await call(api, "POST", "/v1/prefix-consumers/pool/complete",
                              json={"tokens": [{"queue": "t-1", "token": "0.1.a", "x": 1}]})
    assert status in (400, 404), body  # 404 before the definition reaches the node
    if status == 400:
        assert code(body) == "invalid_parameter"


@pytest.mark.parametrize(("headers", "status_code", "expected"), [
    ({"Content-Type": "text/plain"}, 415, "unsupported_media_type"),
    ({"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type"),
    ({"Content-Type": "application/json; charset=latin-1"}, 415, "unsupported_media_type"),
    ({"Content-Type": "application/json", "Content-Encoding": "br"}, 415,
     "unsupported_media_type"),
    ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, 400, "bad_request"),
])
async def test_bodies_the_node_cannot_take_as_json_are_refused(api, headers,
                                                               status_code, expected):
    q = qname()
    status, body = await call(api, "POST", f"/v1/queues/{q}/records",
                              data=b'{"records": [{"value": "x"}]}', headers=headers)
    assert (status, code(body)) == (status_code, expected)
    assert (await call(api, "GET", f"/v1/queues/{q}"))[0] == 404


async def test_json_gzip_and_untyped_bodies_are_taken(api):
    q = qname()
    plain = b'{"records": [{"value": "x"}]}'
    for data, headers in ((plain, {"Content-Type": "application/json; charset=utf-8"}),
                          (plain, {"Content-Type": "application/vnd.vq+json"}),
                          (gzip.compress(plain), {"Content-Type": "application/json",
                                                  "Content-Encoding": "gzip"}),
                          (zlib.compress(plain), {**JSON_TYPE, "Content-Encoding": "deflate"}),
                          (zlib.compress(plain)[2:-4], {**JSON_TYPE,
                                                        "Content-Encoding": "deflate"})):
        status, body = await call(api, "POST", f"/v1/queues/{q}/records",
                                  data=data, headers=headers)
        assert status == 200, body
    status, _ = await raw_request(root(api), post_head(f"/v1/queues/{q}/records".encode(),
                                                  len(plain)), plain)  # no Content-Type
    assert status == 200
    assert len((await read(api, q))["records"]) == 6


async def test_a_small_gzip_body_that_inflates_past_the_limit_gets_413(api):
    q = qname()
    bomb = gzip.compress(b'{"records": [{"value": "' + b"x" * (17 * 1024 * 1024) + b'"}]}')
    assert len(bomb) < 100_000
    status, body = await call(api, "POST", f"/v1/queues/{q}/records", data=bomb,
                              headers={"Content-Type": "application/json",
                                       "Content-Encoding": "gzip"})
    assert (status, code(body)) == (413, "payload_too_large")
    assert (await call(api, "GET", f"/v1/queues/{q}"))[0] == 404


async def test_a_query_holds_only_its_routes_parameters_each_once(api):
    q = qname()
    await enqueue(api, q, "a", "b")
    base = f"/v1/queues/{q}"
    for url in (f"{base}/records?limit=1&wiat_ms=500",  # a misspelt long poll
                f"{base}?limit=5", "/v1/queues?prefx=x",
                f"{base}/consumers/w/stream?credit=5", "/v1/partitions?x=1"):
        status, body = await call(api, "GET", url)
        assert (status, code(body)) == (400, "invalid_parameter"), (url, body)
        assert body["error"]["unknown"] == [url.rsplit("?")[1].split("&")[-1].split("=")[0]]
    status, body = await call(api, "POST", f"{base}/records?sync=1",
                              json={"records": [{"value": "c"}]})
    assert (status, body["error"]["unknown"]) == (400, ["sync"])
    for url in (f"{base}/records?limit=1&limit=2", "/v1/queues?prefix=a&prefix=b",
                f"{base}/records?wait_ms=", "/v1/queues?limit="):  # not integers
        status, body = await call(api, "GET", url)
        assert (status, code(body)) == (400, "invalid_parameter"), (url, body)
    # Nothing was written by the refused enqueue; documented parameters and an array
    # parameter's repeats are taken; probes take any query.
    status, body = await call(api, "GET", f"{base}/records?limit=5&offset=0&wait_ms=0"
                                             "&encoding=utf8")
    assert (status, [r["value"] for r in body["records"]]) == (200, ["a", "b"])
    async with api.get("/metrics?name[]=vq_acks_total&name[]=vq_queues") as r:
        assert r.status == 200 and "vq_queues" in await r.text()
    for probe in ("/healthz", "/readyz"):
        async with api.get(f"{probe}?from=lb") as r:
            assert r.status == 200


async def test_names_queries_and_headers_that_are_not_utf8_get_400(api):
    body = b'{"records": [{"value": "x"}]}'
    status, got = await raw_request(root(api), post_head(b"/v1/queues/%FF%FEabc/records", len(body),
                                                    JSON), body)
    assert (status, code(got)) == (400, "invalid_name")
    # The literal name must not have been made either (one queue, two names).
    status, _ = await call(api, "GET", "/v1/queues/%25FF%25FEabc")
    assert status == 404
    status, got = await raw_request(root(api), b"GET /v1/queues/q/records?tag=%C3 HTTP/1.1\r\n"
                                          b"Host: vq")
    assert (status, code(got)) == (400, "invalid_parameter")
    status, got = await raw_request(root(api), post_head(f"/v1/queues/{qname()}/records".encode(),
                                                    len(body), JSON, b"X-Note: \xff\xfe"),
                                    body)
    assert (status, code(got)) == (400, "bad_request")


async def test_a_body_slower_than_the_timeout_gets_408_and_others_are_served(api):
    q = qname()
    slow = asyncio.create_task(raw_request(
        root(api), post_head(f"/v1/queues/{q}/records".encode(), 100, JSON), b'{"records": '))
    await enqueue(api, q, "served meanwhile")
    status, got = await slow
    assert (status, code(got), known(got)["error"]["retriable"]) == (
        408, "request_timeout", True)
    assert [r["value"] for r in (await read(api, q))["records"]] == ["served meanwhile"]


async def test_the_compat_ack_without_an_offset_is_400_missing_field(api):
    for payload in ({"Queue": "q", "Consumer": "c"}, {"Queue": "q", "Consumer": "c",
                                                       "Offset": None}):
        status, body = await call(api, "POST", "/consumer_ack", json=payload)
        assert (status, code(body)) == (400, "missing_field"), payload


async def test_no_hostile_input_crashed_a_handler(api, node_log):
    """Runs after the tests above (file order): none of their requests reached the catch-all
    that answers 500."""
    await enqueue(api, qname(), "alive")
    log = node_log.getvalue()
    assert not re.search(r"request_crashed|Traceback", log), log[-3000:]


async def test_a_405_names_the_methods_the_route_takes(api):
    async with api.request("PATCH", f"/v1/queues/{qname()}") as r:
        assert r.status == 405
        assert set(r.headers["Allow"].split(",")) >= {"GET", "DELETE"}
        assert (await r.json())["error"]["code"] == "method_not_allowed"


async def test_integer_fields_take_a_number_without_a_fraction_as_json_schema_does(api):
    q = qname()
    status, body = await call(api, "POST", f"/v1/queues/{q}/records",
                              data=b'{"records": [{"value": "a"}, {"value": "b"}]}')
    assert status == 200
    status, body = await call(api, "POST", f"/v1/queues/{q}/consumers/c/ack",
                              data=b'{"offset": 1.0}')
    assert (status, body["offset"]) == (200, 1)
    status, body = await call(api, "POST", f"/v1/queues/{q}/consumers/c/ack",
                              data=b'{"offset": 1.5}')
    assert (status, code(body)) == (400, "invalid_offset")
    status, body = await call(api, "POST", f"/v1/queues/{q}/consumers/c/ack",
                              data=b'{"offset": 1e30}')
    assert (status, code(body)) == (400, "malformed_json")


async def test_a_plain_get_of_the_stream_says_it_is_a_websocket(api):
    status, body = await call(api, "GET",
                              f"/v1/queues/{qname()}/consumers/c/stream")
    assert (status, code(body)) == (400, "bad_request")
    assert "WebSocket" in body["error"]["message"]
