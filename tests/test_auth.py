"""Auth on a real node: 401 with WWW-Authenticate, 403 outside a token's scopes, public health
routes, the token file reloaded without a restart, JWTs, and the client with a token."""

import json
import time

import jwt
import pytest
from vqueues_client import AsyncClient, VQError

from tests.support import NodeProcess, edit_watched_file, http
from vqueues.api.auth import token_hash

SECRET = "test-secret-" + "x" * 24


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def write_tokens(path, tokens):
    path.write_text(json.dumps({"tokens": [
        {"name": n, "sha256": token_hash(t), "scopes": s} for n, t, s in tokens]}))


@pytest.fixture(scope="module")
def secured(topics, tmp_path_factory):
    path = tmp_path_factory.mktemp("auth") / "tokens.json"
    write_tokens(path, [("writer", "w-token", {"write": ["acme/"]}),
                        ("reader", "r-token", {"read": ["acme/"]}),
                        ("ops", "o-token", {"admin": [""], "read": [""], "write": [""]})])
    node = NodeProcess(topics, extra_env={"VQ_AUTH": "true", "VQ_AUTH_TOKEN_FILE": str(path),
                                          "VQ_AUTH_JWT_SECRET": SECRET}).start()
    try:
        yield node, path
    finally:
        node.terminate()


def test_no_token_is_401_with_www_authenticate_and_health_stays_public(secured):
    node, _ = secured
    import urllib.request
    req = urllib.request.Request(f"{node.url}/v1/queues/acme%2Fjobs/records", method="GET")
    try:
        urllib.request.urlopen(req, timeout=10)
        raise AssertionError("expected 401")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401
        assert exc.headers["WWW-Authenticate"].startswith("Bearer")
        body = json.loads(exc.read())
        assert body["error"]["code"] == "unauthenticated" and body["error"]["retriable"] is False
    for path in ("/healthz", "/readyz", "/metrics"):
        assert http("GET", f"{node.url}{path}")[0] == 200


def test_scopes_are_enforced_per_queue_prefix(secured):
    node, _ = secured
    url = f"{node.url}/v1/queues/acme%2Fjobs/records"
    status, _ = http("POST", url, {"records": [{"value": "x"}]}, headers=bearer("w-token"))
    assert status == 200
    status, body = http("GET", url, headers=bearer("w-token"))  # write, not read
    assert (status, body["error"]["code"]) == (403, "forbidden")
    status, body = http("POST", f"{node.url}/v1/queues/other/records",
                        {"records": [{"value": "x"}]}, headers=bearer("w-token"))
    assert status == 403
    status, page = http("GET", url, headers=bearer("r-token"))
    assert status == 200 and [r["value"] for r in page["records"]] == ["x"]
    status, _ = http("DELETE", f"{node.url}/v1/queues/acme%2Fjobs", headers=bearer("r-token"))
    assert status == 403  # delete needs admin
    status, _ = http("GET", f"{node.url}/v1/queues", headers=bearer("r-token"))
    assert status == 403
    status, listing = http("GET", f"{node.url}/v1/queues", headers=bearer("o-token"))
    assert status == 200 and "acme/jobs" in listing["queues"]
    status, _ = http("GET", f"{node.url}/v1/partitions", headers=bearer("w-token"))
    assert status == 200  # any valid token may read the cluster map (clients route with it)


def test_a_multi_queue_enqueue_checks_the_write_scope_of_each_records_queue(secured):
    node, _ = secured
    records = [{"queue": "acme/multi", "value": "in scope"},
               {"queue": "other/multi", "value": "out of scope"}]
    status, body = http("POST", f"{node.url}/v1/records", {"records": records})
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
    status, body = http("POST", f"{node.url}/v1/records", {"records": records},
                        headers=bearer("r-token"))  # read, not write: every record refused
    assert status == 200 and body["failed"] == 2
    status, body = http("POST", f"{node.url}/v1/records", {"records": records},
                        headers=bearer("w-token"))
    assert status == 200, body
    ok, refused = body["results"]
    assert isinstance(ok["offset"], int)
    assert refused["status"] == 403 and refused["error"]["code"] == "forbidden"
    assert refused["error"]["retriable"] is False
    page = http("GET", f"{node.url}/v1/queues/other%2Fmulti/records", headers=bearer("o-token"))
    assert page[0] == 200 and page[1]["records"] == []


def test_the_token_file_is_reloaded_without_a_restart(secured):
    node, path = secured
    url = f"{node.url}/v1/queues/acme%2Fnew/records"
    assert http("POST", url, {"records": [{"value": "x"}]}, headers=bearer("new-token"))[0] == 401
    edit_watched_file(path, lambda c: c["tokens"].append(
        {"name": "new", "sha256": token_hash("new-token"), "scopes": {"write": ["acme/"]}}))
    deadline = time.monotonic() + 10
    status = 401
    while status == 401 and time.monotonic() < deadline:
        time.sleep(0.2)
        status, _ = http("POST", url, {"records": [{"value": "x"}]}, headers=bearer("new-token"))
    assert status == 200


def test_a_signed_jwt_grants_its_scopes_until_it_expires(secured):
    node, _ = secured
    good = jwt.encode({"sub": "svc", "scopes": {"write": ["jwt/"]},
                       "exp": int(time.time()) + 60}, SECRET, algorithm="HS256")
    expired = jwt.encode({"sub": "svc", "scopes": {"write": ["jwt/"]}, "exp": 1}, SECRET,
                         algorithm="HS256")
    url = f"{node.url}/v1/queues/jwt%2Fq/records"
    assert http("POST", url, {"records": [{"value": "x"}]}, headers=bearer(good))[0] == 200
    status, body = http("POST", url, {"records": [{"value": "x"}]}, headers=bearer(expired))
    assert (status, body["error"]["code"]) == (401, "unauthenticated")
    forever = jwt.encode({"sub": "svc", "scopes": {"write": ["jwt/"]}}, SECRET, algorithm="HS256")
    status, body = http("POST", url, {"records": [{"value": "x"}]}, headers=bearer(forever))
    assert (status, body["error"]["code"]) == (401, "unauthenticated")  # no exp: refused


async def test_the_client_sends_its_token(secured):
    node, _ = secured
    async with AsyncClient(node.url, token="o-token") as vq:
        res = await vq.enqueue("acme/client", "hello")
        assert res.offsets
        page = await vq.read("acme/client", offset=0)
        assert [r.text for r in page.records] == ["hello"]
    async with AsyncClient(node.url, token="bad", deadline_s=2) as vq:
        with pytest.raises(VQError) as err:
            await vq.enqueue("acme/client", "nope")
        assert err.value.status == 401


def test_cross_origin_calls_are_allowed_only_from_the_clusters_own_nodes(secured):
    import urllib.request
    node, _ = secured

    def preflight(origin):
        req = urllib.request.Request(f"{node.url}/v1/queues/acme%2Fx", method="OPTIONS", headers={
            "Origin": origin, "Access-Control-Request-Method": "DELETE",
            "Access-Control-Request-Headers": "authorization"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, dict(resp.headers)
        except urllib.error.HTTPError as exc:
            exc.close()
            return exc.code, dict(exc.headers)

    status, headers = preflight(node.url)  # a console served by a node of this cluster
    assert status == 204 and headers["Access-Control-Allow-Origin"] == node.url
    assert "Authorization" in headers["Access-Control-Allow-Headers"]
    status, headers = preflight("http://evil.example")
    assert "Access-Control-Allow-Origin" not in headers
    req = urllib.request.Request(f"{node.url}/v1/queues/acme%2Fx",
                                 headers={"Origin": "http://evil.example", **bearer("o-token")})
    try:
        urllib.request.urlopen(req, timeout=10).close()
    except urllib.error.HTTPError as exc:
        assert "Access-Control-Allow-Origin" not in exc.headers
        exc.close()
    # The console's files are public; the data they fetch is not.
    status, page = http("GET", f"{node.url}/ui/")
    assert status == 200 and b"vqueues console" in page
