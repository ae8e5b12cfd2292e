"""State survives a node killed with SIGKILL: offsets, consumer and queue deletions."""

from tests.support import NodeProcess, create_topics, cursor_counts, http, post


def test_committed_offsets_and_deletions_survive_a_sigkill(bootstrap):
    t = create_topics(bootstrap, partitions=8)
    node = NodeProcess(t).start()
    try:
        offs = post(node, "/v1/queues/jobs/records",
                    {"records": [{"value": f"j{i}"} for i in range(5)]})["offsets"]
        post(node, "/v1/queues/jobs/consumers/w1/ack", {"offset": offs[2]})
        post(node, "/v1/queues/jobs/consumers/w2/ack", {"offset": 0})
        post(node, "/v1/queues/jobs/consumers/gone/ack", {"offset": offs[1]})
        assert http("DELETE", f"{node.url}/v1/queues/jobs/consumers/gone")[0] == 200
        post(node, "/v1/queues/doomed/records", {"records": [{"value": "d0"}]})
        post(node, "/v1/queues/doomed/consumers/w1/ack", {"offset": 0})
        assert http("DELETE", f"{node.url}/v1/queues/doomed")[0] == 200
        post(node, "/v1/queues/doomed/records", {"records": [{"value": "reborn"}]})
    finally:
        assert node.kill() == -9
    node = NodeProcess(t).start()
    try:
        status, info = http("GET", f"{node.url}/v1/queues/jobs")
        assert status == 200
        assert info["records"] == 5
        assert info["consumers"] == [{"consumer": "w1", "offset": offs[2], "lag": 3,
                                      **cursor_counts(3)},
                                     {"consumer": "w2", "offset": 0, "lag": 5,
                                      **cursor_counts(5)}]
        _, got = http("GET", f"{node.url}/v1/queues/jobs/records?consumer=w1")
        assert [r["value"] for r in got["records"]] == ["j2", "j3", "j4"]
        _, doomed = http("GET", f"{node.url}/v1/queues/doomed")
        assert doomed["records"] == 1 and doomed["consumers"] == []
        _, got = http("GET", f"{node.url}/v1/queues/doomed/records?offset=0")
        assert [r["value"] for r in got["records"]] == ["reborn"]
    finally:
        node.terminate()
