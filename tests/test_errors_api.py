"""A node process keeps serving after bad input. The bad input itself, which needs no broker, is
checked in the unit tier: tests/unit/api/test_bad_requests.py."""

from tests.http_calls import call, qname
from tests.support import enqueue, read


async def test_the_node_keeps_serving_after_bad_input(client, node):
    q = qname()
    for _ in range(3):
        await call(client, "POST", f"{node.url}/v1/queues/{q}/records", data=b"{{{")
    await enqueue(client, node, q, "still here")
    assert [r["value"] for r in (await read(client, node, q))["records"]] == ["still here"]
