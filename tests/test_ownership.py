"""Nodes share the partitions through the consumer group; a non-owner answers 409."""

from tests.support import NodeProcess, create_topics, http
from vqueues.hashing import partition_for


def test_two_nodes_split_the_partitions_and_a_non_owner_answers_wrong_node(bootstrap):
    t = create_topics(bootstrap, partitions=8)
    a = NodeProcess(t).start()
    b = NodeProcess(t).start(wait_ready=False)
    try:
        b.wait_ready()
        # Wait until the rebalance has settled: every partition owned exactly once.
        import time
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            owned_a = http("GET", f"{a.url}/v1/partitions")[1]["ready"]
            owned_b = http("GET", f"{b.url}/v1/partitions")[1]["ready"]
            if sorted(owned_a + owned_b) == list(range(8)) and owned_a and owned_b:
                break
            time.sleep(0.2)
        assert sorted(owned_a + owned_b) == list(range(8)), (owned_a, owned_b)
        q = next(f"q{i}" for i in range(1000) if partition_for(f"q{i}", 8) in owned_a)
        status, body = http("POST", f"{a.url}/v1/queues/{q}/records",
                            {"records": [{"value": "x"}]})
        assert status == 200
        status, body = http("GET", f"{b.url}/v1/queues/{q}/records")
        assert status == 409
        assert body["error"]["code"] == "wrong_node"
        assert body["error"]["partition"] == partition_for(q, 8)
    finally:
        b.terminate()
        a.terminate()
