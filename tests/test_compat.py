"""The VirtualQueues routes: its fields, case-insensitively, and its answer shapes."""

import base64
import uuid

import pytest

from tests.support import http


def post(node, path, body):
    return http("POST", f"{node.url}{path}", body)


def test_get_partitions_answers_partition_to_host_port(node, topics):
    status, body = post(node, "/get_partitions", {})
    assert status == 200
    assert body == {str(p): node.url.removeprefix("http://") for p in range(topics.partitions)}


def test_get_records_and_consumer_ack_follow_the_originals_intended_semantics(node):
    q = f"vq-{uuid.uuid4().hex[:6]}"
    offsets = http("POST", f"{node.url}/v1/queues/{q}/records",
                   {"records": [{"value": f"r{i}"} for i in range(12)]})[1]["offsets"]
    status, body = post(node, "/get_records", {"queue": q, "CONSUMER": "c1"})
    assert status == 200
    assert [base64.b64decode(r["r"]).decode() for r in body["Records"]] == \
        [f"r{i}" for i in range(10)]  # MaxRecords defaults to 10
    assert [r["o"] for r in body["Records"]] == offsets[:10]
    # Offset 0 can be acked, and a forward ack is accepted (both were broken in the original).
    assert post(node, "/consumer_ack", {"Queue": q, "Consumer": "c1", "Offset": 0}) == (200, None)
    assert post(node, "/consumer_ack", {"Queue": q, "Consumer": "c1",
                                        "Offset": offsets[5]}) == (200, None)
    status, body = post(node, "/get_records", {"Queue": q, "Consumer": "c1", "Offset": 0,
                                               "MaxRecords": 3})
    assert [r["o"] for r in body["Records"]] == offsets[5:8]
    status, body = post(node, "/get_records", {"Queue": q, "Offset": offsets[11]})
    assert [r["o"] for r in body["Records"]] == [offsets[11]]
    status, body = post(node, "/consumer_ack", {"Queue": q, "Consumer": "c1", "Offset": 1})
    assert (status, body["error"]["code"]) == (409, "rewind_not_allowed")
    assert post(node, "/consumer_ack", {"queue": q, "consumer": "c1", "offset": 1,
                                        "allowrewind": True}) == (200, None)
    status, body = post(node, "/get_records", {"Queue": q, "Consumer": "c1", "MaxRecords": 1})
    assert [r["o"] for r in body["Records"]] == [offsets[1]]
    # Same consumer name on another queue is another consumer.
    status, body = post(node, "/get_records", {"Queue": f"{q}-other", "Consumer": "c1"})
    assert (status, body) == (200, {"Records": []})


@pytest.mark.parametrize(("path", "body", "code"), [
    ("/get_records", {}, "missing_field"),
    ("/get_records", {"Queue": "q", "MaxRecords": 1001}, "limit_out_of_range"),
    ("/get_records", {"Queue": "q", "MaxRecords": -1}, "limit_out_of_range"),
    ("/get_records", {"Queue": "q", "Offset": "5"}, "invalid_parameter"),
    ("/consumer_ack", {"Queue": "q", "Consumer": "c"}, "missing_field"),
    ("/consumer_ack", {"Queue": "q", "Offset": 1}, "missing_field"),
    ("/consumer_ack", {"Queue": "q", "Consumer": "c", "Offset": -3}, "invalid_offset"),
])
def test_bad_compat_requests_get_400(node, path, body, code):
    status, out = post(node, path, body)
    assert (status, out["error"]["code"]) == (400, code)
