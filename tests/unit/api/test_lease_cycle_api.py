"""The lease cycle's HTTP surface (ADR 16) through the app over the fakes: `complete` on a lease,
answered token by token, and `durable_grants` on a consumer and a prefix consumer."""

import pytest

pytestmark = pytest.mark.unit


async def _json(api, method, path, body=None):
    async with api.request(method, path, json=body) as resp:
        return resp.status, await resp.json()


async def test_a_lease_completes_the_tokens_it_carries_and_says_what_each_did(api):
    status, _ = await _json(api, "POST", "/v1/queues/cy/records",
                            {"records": [{"value": f"v{i}"} for i in range(4)]})
    assert status == 200
    status, first = await _json(api, "POST", "/v1/queues/cy/consumers/w/lease",
                                {"max_records": 2})
    assert status == 200 and "completed" not in first and "refused" not in first
    tokens = [r["token"] for r in first["records"]]
    status, second = await _json(api, "POST", "/v1/queues/cy/consumers/w/lease",
                                 {"max_records": 2, "complete": [*tokens, "x.y"]})
    assert status == 200
    assert second["completed"] == tokens
    assert second["refused"] == [{"token": "x.y", "code": "invalid_token"}]
    assert [r["value"] for r in second["records"]] == ["v2", "v3"]
    status, info = await _json(api, "GET", "/v1/queues/cy")
    assert info["consumers"][0]["offset"] == first["records"][1]["offset"] + 1


@pytest.mark.parametrize("complete", ["t", [1], {"a": 1}])
async def test_a_lease_whose_complete_is_not_a_list_of_tokens_gets_400(api, complete):
    status, body = await _json(api, "POST", "/v1/queues/cy2/consumers/w/lease",
                               {"complete": complete})
    assert (status, body["error"]["code"]) == (400, "invalid_token")


async def test_a_lease_completes_at_most_ten_thousand_tokens(api):
    status, body = await _json(api, "POST", "/v1/queues/cy3/consumers/w/lease",
                               {"complete": ["1.1.a"] * 10_001})
    assert (status, body["error"]["code"], body["error"]["max"]) == (
        400, "limit_out_of_range", 10_000)


async def test_durable_grants_is_a_consumer_setting_kept_until_changed(api):
    status, got = await _json(api, "PUT", "/v1/queues/dg/consumers/w",
                              {"mode": "lease", "durable_grants": True})
    assert (status, got["durable_grants"]) == (200, True)
    status, got = await _json(api, "GET", "/v1/queues/dg/consumers/w")
    assert got["durable_grants"] is True
    status, got = await _json(api, "PUT", "/v1/queues/dg/consumers/w", {"max_attempts": 4})
    assert got["durable_grants"] is True  # kept when not given
    status, body = await _json(api, "PUT", "/v1/queues/dg/consumers/w",
                               {"durable_grants": "yes"})
    assert (status, body["error"]["code"]) == (400, "invalid_parameter")
    status, body = await _json(api, "PUT", "/v1/prefix-consumers/dgp2",
                               {"prefix": "dgp2-", "durable_grants": 1})
    assert (status, body["error"]["code"]) == (400, "invalid_parameter")
