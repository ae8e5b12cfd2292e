"""The node's request limits, published in the cluster map."""

import pytest

from tests.support import NodeProcess, http

MAX_BODY, MAX_RECORD = 256 * 1024, 64 * 1024


@pytest.fixture(scope="module")
def small_node(topics):
    """A node whose body and record limits are far below their defaults."""
    n = NodeProcess(topics, extra_env={"VQ_MAX_BODY_BYTES": str(MAX_BODY),
                                       "VQ_MAX_RECORD_BYTES": str(MAX_RECORD),
                                       "VQ_MAX_BATCH_RECORDS": "500"}).start()
    try:
        yield n
    finally:
        n.terminate()


def test_the_cluster_map_publishes_the_nodes_request_limits(small_node):
    status, body = http("GET", f"{small_node.url}/v1/partitions")
    assert status == 200
    assert body["limits"] == {"max_body_bytes": MAX_BODY, "max_batch_records": 500,
                              "max_record_bytes": MAX_RECORD}
    schema = http("GET", f"{small_node.url}/v1/openapi.json")[1]["components"]["schemas"]
    assert "limits" in schema["PartitionsInfo"]["required"]
    assert set(schema["NodeLimits"]["properties"]) == set(body["limits"])
