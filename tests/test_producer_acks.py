"""The documented trade of durability for latency: producer acks 1 or 0."""

import time

import pytest

from tests.support import NodeProcess, create_topics, http


@pytest.mark.parametrize("acks", ["1", "0"])
def test_weaker_producer_acks_still_deliver_and_say_what_they_know(bootstrap, acks):
    t = create_topics(bootstrap, partitions=2)
    node = NodeProcess(t, extra_env={"VQ_PRODUCER_ACKS": acks}).start()
    try:
        status, body = http("POST", f"{node.url}/v1/queues/fast/records",
                            {"records": [{"value": "a"}, {"value": "b"}]})
        assert status == 200
        if acks == "0":
            assert body["offsets"] is None  # the broker reports no offsets with acks=0
        else:
            assert body["offsets"] == [0, 1]
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            _, got = http("GET", f"{node.url}/v1/queues/fast/records?wait_ms=500")
            if len(got["records"]) == 2:
                break
        assert [r["value"] for r in got["records"]] == ["a", "b"]
    finally:
        node.terminate()
