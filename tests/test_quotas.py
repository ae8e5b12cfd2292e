"""Per-tenant enqueue quotas on a real node: 429 with Retry-After in the JSON error form,
nothing written by a refused request, other tenants unaffected, the file reloaded live."""

import json
import time

import pytest

from tests.support import NodeProcess, edit_watched_file, http


@pytest.fixture(scope="module")
def limited(topics, tmp_path_factory):
    path = tmp_path_factory.mktemp("quotas") / "quotas.json"
    path.write_text(json.dumps({"quotas": [
        {"prefix": "noisy/", "records_per_s": 2, "burst_s": 5},
        {"prefix": "big/", "bytes_per_s": 1000, "burst_s": 1}]}))
    node = NodeProcess(topics, extra_env={"VQ_QUOTA_FILE": str(path)}).start()
    try:
        yield node, path
    finally:
        node.terminate()


def enqueue(node, queue, n=1, size=1):
    return http("POST", f"{node.url}/v1/queues/{queue.replace('/', '%2F')}/records",
                {"records": [{"value": "x" * size} for _ in range(n)]})


def test_a_tenant_over_its_quota_gets_429_and_others_do_not(limited):
    node, _ = limited
    assert enqueue(node, "noisy/a", n=10)[0] == 200  # the burst: 5 s at 2/s
    status, body = enqueue(node, "noisy/b", n=1)  # the same tenant, another queue
    assert status == 429
    err = body["error"]
    assert err["code"] == "quota_exceeded" and err["retriable"] is True
    assert err["prefix"] == "noisy/" and err["limit"] == "records_per_s"
    status, _ = http("GET", f"{node.url}/v1/queues/noisy%2Fb")
    assert status == 404  # nothing was written
    for _ in range(5):
        assert enqueue(node, "quiet/q", n=100)[0] == 200  # no quota for this prefix
    _, metrics = http("GET", f"{node.url}/metrics")
    assert b'vq_quota_refusals_total{prefix="noisy/"}' in metrics


def test_retry_after_is_sent_and_honoured(limited):
    node, _ = limited
    import urllib.error
    import urllib.request
    while enqueue(node, "noisy/c")[0] == 200:
        pass
    req = urllib.request.Request(f"{node.url}/v1/queues/noisy%2Fc/records", method="POST",
                                 data=b'{"records": [{"value": "x"}]}',
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=10)
    assert err.value.code == 429
    retry_after = int(err.value.headers["Retry-After"])
    assert json.loads(err.value.read())["error"]["code"] == "quota_exceeded"
    err.value.close()
    assert 1 <= retry_after <= 2
    time.sleep(retry_after)
    assert enqueue(node, "noisy/c")[0] == 200


def test_bytes_are_limited_too(limited):
    node, _ = limited
    assert enqueue(node, "big/q", n=1, size=900)[0] == 200
    status, body = enqueue(node, "big/q", n=1, size=900)
    assert status == 429 and body["error"]["limit"] == "bytes_per_s"


def test_the_quota_file_is_reloaded_without_a_restart(limited):
    node, path = limited
    while enqueue(node, "noisy/d")[0] == 200:
        pass
    edit_watched_file(path, lambda c: c["quotas"][0].update(records_per_s=100000))
    deadline = time.monotonic() + 10
    status = 429
    while status == 429 and time.monotonic() < deadline:
        time.sleep(0.3)
        status, _ = enqueue(node, "noisy/d", n=50)
    assert status == 200
