"""TLS on real nodes, with a certificate the test makes: HTTPS served, https:// URLs in the
cluster map, the client verifying against a CA bundle (and refusing without it), and a request
forwarded over HTTPS keeping the caller's identity, which the owner authorises."""

import json

import pytest
from vqueues_client import AsyncClient, DeadlineExceeded

from tests.support import (
    NodeProcess,
    http,
    make_certificates,
    queues_in_partition,
    wait_settled,
)
from vqueues.api.auth import token_hash


@pytest.fixture(scope="module")
def tls_cluster(topics, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    ca, cert, key = make_certificates(directory)
    tokens = directory / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"name": "acme", "sha256": token_hash("acme-token"),
         "scopes": {"read": ["acme/"], "write": ["acme/"]}}]}))
    env = {"VQ_TLS_CERT": cert, "VQ_TLS_KEY": key, "VQ_TLS_CA_FILE": ca, "VQ_FORWARD": "true",
           "VQ_AUTH": "true", "VQ_AUTH_TOKEN_FILE": str(tokens)}
    nodes = [NodeProcess(topics, node_id=f"tls-{i}", extra_env=env, ca_file=ca)
             for i in range(2)]
    try:
        for n in nodes:
            n.start(wait_ready=False)
        for n in nodes:
            n.wait_ready()
        yield nodes, ca
    finally:
        for n in nodes:
            n.terminate()


def _settled(nodes, ca, partitions):
    return wait_settled(nodes, partitions, ca_file=ca)


def test_https_is_served_and_the_cluster_map_advertises_https(tls_cluster, topics):
    nodes, ca = tls_cluster
    owners = _settled(nodes, ca, topics.partitions)
    assert all(url.startswith("https://127.0.0.1:") for url in owners.values())
    status, body = http("GET", f"{nodes[0].url}/v1/partitions", ca_file=ca,
                        headers={"Authorization": "Bearer acme-token"})
    assert status == 200
    assert body["url"].startswith("https://")
    assert all(o["url"].startswith("https://") for o in body["owners"].values())
    # Without the CA the certificate is not trusted: no answer at all.
    assert http("GET", f"{nodes[0].url}/healthz")[0] == 0
    # Plain HTTP to the HTTPS port gets no HTTP answer either.
    assert http("GET", nodes[0].url.replace("https", "http") + "/healthz")[0] == 0


async def test_the_client_verifies_with_a_ca_bundle(tls_cluster, topics):
    nodes, ca = tls_cluster
    owners = _settled(nodes, ca, topics.partitions)
    names = [queues_in_partition(p, topics.partitions, 1, prefix="acme/tls")[0]
             for p in sorted(owners)[:4]]
    async with AsyncClient(nodes[0].url, token="acme-token", ca_file=ca) as vq:
        for name in names:
            await vq.enqueue(name, f"secret {name}")
        for name in names:
            page = await vq.read(name, offset=0)
            assert [r.text for r in page.records] == [f"secret {name}"]
    async with AsyncClient(nodes[0].url, token="acme-token", deadline_s=1) as vq:
        with pytest.raises(DeadlineExceeded) as err:  # the system CAs do not know the test's CA
            await vq.enqueue(names[0], "never sent")
        # No node answered (retriable) until the deadline: the last error names the cause.
        last = err.value.last
        assert last is not None and last.retriable and last.code == "no_node_reachable"
        assert "CERTIFICATE_VERIFY_FAILED" in str(err.value)


def test_a_forwarded_request_keeps_the_callers_identity(tls_cluster, topics):
    nodes, ca = tls_cluster
    owners = _settled(nodes, ca, topics.partitions)
    other = next(p for p, url in owners.items() if url != nodes[0].url)
    mine = queues_in_partition(other, topics.partitions, 1, prefix="acme/fwd")[0]
    theirs = queues_in_partition(other, topics.partitions, 1, prefix="zeta/fwd")[0]
    token = {"Authorization": "Bearer acme-token"}
    q = mine.replace("/", "%2F")
    # Sent to the node that does not own it: forwarded over HTTPS, authorised by the owner.
    status, body = http("POST", f"{nodes[0].url}/v1/queues/{q}/records",
                        {"records": [{"value": "via proxy"}]}, headers=token, ca_file=ca)
    assert status == 200, body
    status, page = http("GET", f"{nodes[0].url}/v1/queues/{q}/records?offset=0",
                        headers=token, ca_file=ca)
    assert status == 200 and [r["value"] for r in page["records"]] == ["via proxy"]
    # Outside the token's prefixes: refused, whichever node is asked.
    t = theirs.replace("/", "%2F")
    for node in nodes:
        status, body = http("POST", f"{node.url}/v1/queues/{t}/records",
                            {"records": [{"value": "x"}]}, headers=token, ca_file=ca)
        assert (status, body["error"]["code"]) == (403, "forbidden")
    status, body = http("POST", f"{nodes[0].url}/v1/queues/{q}/records",
                        {"records": [{"value": "x"}]}, ca_file=ca)
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
