"""The lease cycle's HTTP surface (ADR 16) through the app over the fakes: `complete` on a lease
and on a stream's credit, answered token by token, and `durable_grants` on a consumer and a
prefix consumer."""

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


async def _frame(ws, kind):
    """The next frame of `kind` (records pushed meanwhile are skipped)."""
    while True:
        frame = await ws.receive_json(timeout=5)
        if frame["type"] == kind:
            return frame


async def test_a_streams_credit_completes_the_tokens_it_carries_and_says_what_each_did(api):
    status, _ = await _json(api, "POST", "/v1/queues/cs/records",
                            {"records": [{"value": f"v{i}"} for i in range(4)]})
    assert status == 200
    async with api.ws_connect("/v1/queues/cs/consumers/w/stream?mode=lease") as ws:
        await ws.send_json({"op": "credit", "n": 2})  # no `complete`: no answer, as before
        first = (await _frame(ws, "records"))["records"]
        assert [r["value"] for r in first] == ["v0", "v1"]
        tokens = [r["token"] for r in first]
        await ws.send_json({"op": "credit", "n": 2, "id": 7,
                            "complete": [*tokens, tokens[0], "x.y"]})
        frames = [await ws.receive_json(timeout=5), await ws.receive_json(timeout=5)]
        [result] = [f for f in frames if f["type"] == "result"]
        [pushed] = [f for f in frames if f["type"] == "records"]  # the credit was added
        assert result == {"type": "result", "id": 7, "op": "credit", "result": {
            "completed": tokens, "refused": [{"token": "x.y", "code": "invalid_token"}]}}
        assert [r["value"] for r in pushed["records"]] == ["v2", "v3"]
        status, info = await _json(api, "GET", "/v1/queues/cs")
        assert info["consumers"][0]["offset"] == first[1]["offset"] + 1
        await ws.send_json({"op": "credit", "n": 1, "id": 8, "complete": tokens})
        again = await _frame(ws, "result")  # done already: completed again
        assert (again["id"], again["result"]) == (8, {"completed": tokens, "refused": []})


@pytest.mark.parametrize(("complete", "code"), [
    ("t", "invalid_token"), ([1], "invalid_token"), (["1.1.a"] * 10_001, "limit_out_of_range")])
async def test_a_credit_with_a_bad_complete_is_an_error_frame_and_adds_no_credit(
        api, complete, code):
    async with api.ws_connect("/v1/queues/cs2/consumers/w/stream?mode=lease") as ws:
        await ws.send_json({"op": "credit", "n": 10_000, "id": 1, "complete": complete})
        err = await ws.receive_json(timeout=5)
        assert (err["type"], err["id"], err["op"], err["error"]["code"]) == (
            "error", 1, "credit", code)
        # The whole credit is still to be had: the frame above added none.
        await ws.send_json({"op": "credit", "n": 10_000})
        await ws.send_json({"op": "nope", "id": 2})
        err = await ws.receive_json(timeout=5)
        assert (err["id"], err["error"]["code"]) == (2, "invalid_parameter")


async def test_a_credit_carrying_completions_on_a_cursor_stream_is_a_mode_mismatch(api):
    async with api.ws_connect("/v1/queues/cs3/consumers/r/stream?mode=cursor") as ws:
        await ws.send_json({"op": "credit", "n": 10_000, "id": "c", "complete": ["1.1.1"]})
        err = await ws.receive_json(timeout=5)
        assert (err["id"], err["error"]["code"], err["error"]["mode"]) == (
            "c", "consumer_mode_mismatch", "cursor")
        await ws.send_json({"op": "credit", "n": 10_000})  # none was added
        await ws.send_json({"op": "nope", "id": 2})
        err = await ws.receive_json(timeout=5)
        assert (err["id"], err["error"]["code"]) == (2, "invalid_parameter")
