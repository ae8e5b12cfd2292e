"""The WebSocket stream's answers over a real socket (docs/work-queues.md, "Streaming over a
WebSocket"): a frame's answer echoes its `id` only when it had one, and only the stream's end is
`final`."""

import pytest

pytestmark = pytest.mark.unit


async def test_a_refused_plain_credit_has_no_id_and_the_stream_goes_on(api):
    async with api.ws_connect("/v1/queues/sf/consumers/w/stream?mode=lease") as ws:
        await ws.send_json({"op": "credit", "n": 0})
        err = await ws.receive_json(timeout=5)
        assert err == {"type": "error", "op": "credit", "error": {
            "code": "invalid_parameter", "message": "credit `n` must be a positive integer",
            "retriable": False}}
        await ws.send_json({"op": "credit", "n": 10_001})
        err = await ws.receive_json(timeout=5)
        assert "id" not in err and "final" not in err
        assert (err["op"], err["error"]["code"]) == ("credit", "limit_out_of_range")
        await ws.send_str("not json")  # a frame that is not an object: no op, no id
        err = await ws.receive_json(timeout=5)
        assert err.keys() == {"type", "error"} and err["error"]["code"] == "malformed_json"
        # The stream went on: the socket is open and answers the next op.
        await ws.send_json({"op": "complete", "tokens": ["x.y"]})
        err = await ws.receive_json(timeout=5)
        assert "id" not in err and (err["op"], err["error"]["code"]) == (
            "complete", "invalid_token")
        await ws.send_json({"op": "complete", "tokens": ["x.y"], "id": None})  # echoed as sent
        err = await ws.receive_json(timeout=5)
        assert err["id"] is None and "final" not in err
        assert not ws.closed


async def test_a_result_echoes_the_id_only_when_the_op_had_one(api):
    async with api.request("POST", "/v1/queues/sr/records", json={"records": [{"value": "a"}]}):
        pass
    async with api.ws_connect("/v1/queues/sr/consumers/r/stream?mode=cursor") as ws:
        await ws.send_json({"op": "ack", "offset": 0})
        result = await ws.receive_json(timeout=5)
        assert result["type"] == "result" and "id" not in result
        await ws.send_json({"op": "ack", "offset": 0, "id": "a"})
        result = await ws.receive_json(timeout=5)
        assert (result["type"], result["id"]) == ("result", "a")


async def test_the_error_that_ends_the_stream_is_final_and_the_socket_closes(api):
    async with api.request("POST", "/v1/queues/se/consumers/r/ack", json={"offset": 0}) as resp:
        assert resp.status == 200  # r is a cursor consumer: a lease stream of it cannot go on
    async with api.ws_connect("/v1/queues/se/consumers/r/stream?mode=lease") as ws:
        await ws.send_json({"op": "credit", "n": 1})
        end = await ws.receive_json(timeout=5)
        assert "id" not in end and "op" not in end
        assert (end["type"], end["final"], end["error"]["code"]) == (
            "error", True, "consumer_mode_mismatch")
        closing = await ws.receive(timeout=5)
        assert ws.closed, closing
