"""Black-box tests of issue 58, one round trip per cycle, written from the docs alone: completions
that ride on a lease (`complete`), on a prefix lease and on a stream's credit frame, the answer's
`completed` and `refused`, their limits and errors, the `durable_grants` choice, and the Python
client's `lease(..., complete=...)` and Worker hook (README.md, docs/work-queues.md,
docs/api.md, docs/reliability.md, the OpenAPI document, clients/python/README.md)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import pytest
from vqueues_client import AsyncClient, Client, Lease, Worker

from tests.support import NodeProcess, create_topics, queues_in_partition

# docs/api.md, Limits: "lease `complete` (and a stream credit frame's) | at most 10,000 tokens".
MAX_RIDING = 10_000
# A token as the README shows one (where a well-formed token is all that matters).
NEVER_GRANTED = "0.1.5f0c2a9e41b7"


def forged(token: str) -> str:
    """A token of the same record and attempt that no lease call granted: only its last part,
    the grant, differs (the README's tokens read `offset.attempt.grant`)."""
    offset, attempt, grant = token.split(".")
    return f"{offset}.{attempt}.{'0' * len(grant) if grant.strip('0') else '1'}"


def qname(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def call(client: aiohttp.ClientSession, method: str, url: str,
               body: Any = None) -> tuple[int, Any]:
    async with client.request(method, url, json=body) as r:
        return r.status, await r.json()


async def ok(client: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    status, out = await call(client, method, url, body)
    assert status == 200, out
    return out


async def fill(client: aiohttp.ClientSession, node: NodeProcess, queue: str, n: int,
               headers: dict[str, str] | None = None) -> None:
    records = [{"value": f"v{i}", **({"headers": headers} if headers else {})} for i in range(n)]
    await ok(client, "POST", f"{node.url}/v1/queues/{queue}/records", {"records": records})


def consumer_base(node: NodeProcess, queue: str, consumer: str = "w") -> str:
    return f"{node.url}/v1/queues/{queue}/consumers/{consumer}"


async def lease(client: aiohttp.ClientSession, base: str, **body: Any) -> Any:
    return await ok(client, "POST", f"{base}/lease", body)


async def counts(client: aiohttp.ClientSession, node: NodeProcess, queue: str,
                 consumer: str = "w") -> dict[str, Any]:
    info = await ok(client, "GET", f"{node.url}/v1/queues/{queue}")
    return next(c for c in info["consumers"] if c["consumer"] == consumer)


def assert_error(status: int, out: Any, want_status: int, code: str) -> dict[str, Any]:
    assert status == want_status, out
    err = out["error"]
    assert err["code"] == code, out
    assert err["retriable"] is False, out
    assert isinstance(err["message"], str) and err["message"]
    return dict(err)


# --- the lease route's `complete` -----------------------------------------------------------

async def test_a_lease_completes_its_tokens_first_and_answers_completed_and_refused(node, client):
    """work-queues.md: tokens are completed token by token (not all or nothing); `completed` lists
    done ones, `refused` {token, code} with `lease_expired` or `invalid_token`."""
    q = qname("ride")
    base = consumer_base(node, q)
    await fill(client, node, q, 6)
    first = await lease(client, base, max_records=3)
    tokens = [r["token"] for r in first["records"]]
    assert len(tokens) == 3
    never = forged(tokens[2])  # record 2 stays leased under its real token
    page = await lease(client, base, max_records=3,
                       complete=[tokens[0], "not-a-token", never, tokens[1]])
    assert sorted(page["completed"]) == sorted(tokens[:2])
    assert sorted(page["refused"], key=lambda r: r["token"]) == sorted(
        [{"token": "not-a-token", "code": "invalid_token"},
         {"token": never, "code": "lease_expired"}], key=lambda r: r["token"])
    # The lease's own records are the next ones, lowest offset first.
    assert [r["value"] for r in page["records"]] == ["v3", "v4", "v5"]
    c = await counts(client, node, q)
    # Offsets 0 and 1 done: the low-water mark moved past them; 2 and 3..5 are leased.
    assert c["in_flight"] == 4
    assert c["offset"] == first["records"][1]["offset"] + 1


async def test_strings_that_are_not_tokens_are_each_refused_invalid_token(node, client):
    """api.md Limits: a lease token is "opaque, at most 64 characters"; a string in `complete`
    that is not a token is refused `invalid_token`, token by token, beside the others."""
    q = qname("nottokens")
    base = consumer_base(node, q)
    await fill(client, node, q, 2)
    t = (await lease(client, base))["records"][0]["token"]
    junk = ["", "9" * 65, "1.1.zz", "-1.1", "a.b.c", " " + t]
    page = await lease(client, base, complete=[*junk, t])
    assert page["completed"] == [t]
    assert sorted(page["refused"], key=lambda r: r["token"]) == sorted(
        [{"token": j, "code": "invalid_token"} for j in junk], key=lambda r: r["token"])


async def test_a_token_completed_twice_is_completed_again(node, client):
    """work-queues.md: `completed` is "done, or found done already: safe to send again"; and a
    standalone complete of a done record succeeds again."""
    q = qname("twice")
    base = consumer_base(node, q)
    await fill(client, node, q, 2)
    t = (await lease(client, base))["records"][0]["token"]
    assert (await lease(client, base, complete=[t]))["completed"] == [t]
    again = await lease(client, base, complete=[t])
    assert again["completed"] == [t] and again["refused"] == []
    done = await ok(client, "POST", f"{base}/complete", {"tokens": [t]})
    assert done["done"] == [t]


async def test_a_repeated_token_in_one_call_is_completed_once(node, client):
    """work-queues.md (stream): tokens are completed "as a lease's are (repeats dropped; ...)"."""
    q = qname("repeat")
    base = consumer_base(node, q)
    await fill(client, node, q, 1)
    t = (await lease(client, base))["records"][0]["token"]
    page = await lease(client, base, complete=[t, t, t])
    assert page["completed"] == [t] and page["refused"] == []


async def test_an_expired_token_whose_record_was_leased_again_is_refused_lease_expired(
        node, client):
    """work-queues.md: `lease_expired` is "not current, as below; the record will come again";
    a token whose lease expired and whose record nobody leased since still completes."""
    q = qname("expired")
    base = consumer_base(node, q)
    await fill(client, node, q, 2)
    old = (await lease(client, base, max_records=2, visibility_ms=100))["records"]
    await asyncio.sleep(0.4)
    # Record 0 is leased again under a new token; record 1 is left alone.
    again = (await lease(client, base, max_records=1, visibility_ms=60_000))["records"]
    assert [r["offset"] for r in again] == [old[0]["offset"]] and again[0]["attempt"] == 2
    page = await lease(client, base, complete=[old[0]["token"], old[1]["token"]])
    assert page["refused"] == [{"token": old[0]["token"], "code": "lease_expired"}]
    assert page["completed"] == [old[1]["token"]]
    # The refused one is still the new holder's to complete.
    c = await counts(client, node, q)
    assert c["in_flight"] == 1
    assert (await lease(client, base, complete=[again[0]["token"]]))["completed"] == [
        again[0]["token"]]
    assert (await counts(client, node, q))["lag"] == 0


async def test_a_token_of_another_consumer_or_queue_is_refused_and_left_alone(node, client):
    """A token is the delivery of one consumer on one queue: elsewhere it is not current."""
    other_q, q = queues_in_partition(7, 16, 2, prefix=qname("pair"))
    await fill(client, node, other_q, 1)
    await fill(client, node, q, 1)
    a = consumer_base(node, q, "a")
    t = (await lease(client, a, visibility_ms=60_000))["records"][0]["token"]
    b_page = await lease(client, consumer_base(node, q, "b"), complete=[t])
    assert b_page["completed"] == [] and b_page["refused"] == [
        {"token": t, "code": "lease_expired"}]
    elsewhere = await lease(client, consumer_base(node, other_q, "a"), complete=[t])
    assert elsewhere["completed"] == [] and elsewhere["refused"] == [
        {"token": t, "code": "lease_expired"}]
    # Nothing was done to consumer a's record on q.
    assert (await counts(client, node, q, "a"))["in_flight"] == 1
    assert (await ok(client, "POST", f"{a}/complete", {"tokens": [t]}))["done"] == [t]


async def test_another_queues_token_below_the_consumers_mark_never_existed_here(node, client):
    """work-queues.md: a token that "never existed" is `lease_expired`, riding or standalone,
    also when it names an offset below the consumer's mark (another queue's record)."""
    a, b = queues_in_partition(5, 16, 2, prefix=qname("below"))
    await fill(client, node, a, 1)
    await fill(client, node, b, 2)
    a_token = (await lease(client, consumer_base(node, a)))["records"][0]["token"]
    page = await lease(client, consumer_base(node, b), complete=[a_token])
    assert page["completed"] == [] and page["refused"] == [
        {"token": a_token, "code": "lease_expired"}], page
    status, out = await call(client, "POST", f"{consumer_base(node, b)}/complete",
                             {"tokens": [a_token]})
    assert_error(status, out, 409, "lease_expired")
    # a's record is still a's to complete.
    assert (await ok(client, "POST", f"{consumer_base(node, a)}/complete",
                     {"tokens": [a_token]}))["done"] == [a_token]


@pytest.mark.parametrize("bad", ["0.1", [1], [None], ["ok", {"t": 1}], {"token": "0.1"}])
async def test_complete_that_is_not_a_list_of_strings_is_invalid_token_and_does_nothing(
        node, client, bad):
    """work-queues.md: "`complete` that is not a list of strings is `400 invalid_token` for the
    whole call, before anything is done"; api.md: invalid_token is 400, not retriable."""
    q = qname("badlist")
    base = consumer_base(node, q)
    await fill(client, node, q, 2)
    t = (await lease(client, base))["records"][0]["token"]
    body = {"max_records": 1, "complete": [t, *bad] if isinstance(bad, list) else bad}
    status, out = await call(client, "POST", f"{base}/lease", body)
    assert_error(status, out, 400, "invalid_token")
    c = await counts(client, node, q)
    assert c["in_flight"] == 1 and c["available"] == 1  # neither completed nor leased


async def test_the_documented_maximum_of_tokens_is_taken_and_one_more_is_refused(node, client):
    """api.md Limits: at most 10,000 tokens; limit_out_of_range has `parameter`, `min`, `max`
    (the stream names that code for a credit over 10,000; the lease route names none)."""
    q = qname("max")
    base = consumer_base(node, q)
    await fill(client, node, q, 2)
    t = (await lease(client, base))["records"][0]["token"]
    over = [t] + [f"x{i}" for i in range(MAX_RIDING)]
    status, out = await call(client, "POST", f"{base}/lease", {"complete": over})
    err = assert_error(status, out, 400, "limit_out_of_range")
    assert err["parameter"] == "complete" and err["max"] == MAX_RIDING
    assert (await counts(client, node, q))["in_flight"] == 1  # nothing done
    page = await lease(client, base, complete=over[:MAX_RIDING])
    assert page["completed"] == [t]
    assert len(page["refused"]) == MAX_RIDING - 1
    assert {r["code"] for r in page["refused"]} == {"invalid_token"}


async def test_an_empty_or_null_complete_is_a_plain_lease(node, client):
    """api.md: an optional field sent as null counts as left out where its type includes null
    (the OpenAPI document's `complete` is array or null; it has no minItems)."""
    q = qname("empty")
    base = consumer_base(node, q)
    await fill(client, node, q, 2)
    a = await lease(client, base, complete=None)
    assert len(a["records"]) == 1
    b = await lease(client, base, complete=[])
    assert len(b["records"]) == 1
    assert b.get("completed", []) == [] and b.get("refused", []) == []


async def test_completions_free_room_and_keys_for_the_same_lease(node, client):
    """work-queues.md: completed first, "so the records, keys and in-flight room they free
    count for the lease"."""
    q = qname("room")
    base = consumer_base(node, q)
    await ok(client, "PUT", base, {"mode": "lease", "max_in_flight": 1})
    await fill(client, node, q, 3)
    first = (await lease(client, base, max_records=5))["records"]
    assert len(first) == 1
    assert (await lease(client, base))["records"] == []  # the cap holds
    page = await lease(client, base, max_records=5, complete=[first[0]["token"]])
    assert [r["value"] for r in page["records"]] == ["v1"]

    keyed = qname("keyed")
    kbase = consumer_base(node, keyed)
    await fill(client, node, keyed, 2, headers={"vq-ordering-key": "k"})
    one = (await lease(client, kbase, max_records=5))["records"]
    assert [r["value"] for r in one] == ["v0"]
    page = await lease(client, kbase, max_records=5, complete=[one[0]["token"]])
    assert [r["value"] for r in page["records"]] == ["v1"]


async def test_with_wait_ms_the_completions_are_written_before_the_wait(node, client):
    """work-queues.md: "With `wait_ms`, the completions are written at once and the call then
    waits for records as any lease does"."""
    q = qname("wait")
    base = consumer_base(node, q)
    await fill(client, node, q, 1)
    t = (await lease(client, base))["records"][0]["token"]
    waiting = asyncio.create_task(lease(client, base, complete=[t], wait_ms=10_000))
    for _ in range(100):
        await asyncio.sleep(0.05)
        c = await counts(client, node, q)
        if c["in_flight"] == 0:
            break
    assert not waiting.done()  # still waiting for a record...
    assert c["in_flight"] == 0 and c["lag"] == 0  # ...with the completion already done
    await fill(client, node, q, 1)
    page = await waiting
    assert page["completed"] == [t] and [r["value"] for r in page["records"]] == ["v0"]


async def test_a_record_whose_riding_completion_was_answered_never_comes_again(node, client):
    """work-queues.md: "done: completed ... Never delivered again to this consumer"."""
    q = qname("never")
    base = consumer_base(node, q)
    await fill(client, node, q, 20)
    seen: list[int] = []
    tokens: list[str] = []
    for _ in range(10):
        page = await lease(client, base, max_records=4, visibility_ms=200, complete=tokens)
        assert sorted(page["completed"]) == sorted(tokens) and page["refused"] == []
        tokens = [r["token"] for r in page["records"]]
        seen += [r["offset"] for r in page["records"]]
        if not tokens:
            break
    assert len(seen) == len(set(seen)) == 20
    await asyncio.sleep(0.4)  # every deadline passed: nothing is in flight to come back
    assert (await lease(client, base, max_records=50))["records"] == []
    c = await counts(client, node, q)
    assert (c["lag"], c["in_flight"], c["available"]) == (0, 0, 0)


async def test_a_lease_with_complete_on_a_cursor_consumer_is_a_mode_mismatch(node, client):
    """work-queues.md: leasing a consumer set to `cursor` is `409 consumer_mode_mismatch`."""
    q = qname("cursor")
    base = consumer_base(node, q)
    await fill(client, node, q, 1)
    await ok(client, "PUT", base, {"mode": "cursor"})
    status, out = await call(client, "POST", f"{base}/lease", {"complete": [NEVER_GRANTED]})
    err = assert_error(status, out, 409, "consumer_mode_mismatch")
    assert err["mode"] == "cursor"


# --- durable_grants --------------------------------------------------------------------------

async def test_durable_grants_is_settable_and_reported_back(node, client):
    """work-queues.md Settings: `durable_grants` (default false) in the PUT and GET answers."""
    q = qname("durable")
    base = consumer_base(node, q)
    await fill(client, node, q, 3)
    await lease(client, base)  # made a lease consumer with the defaults
    assert (await ok(client, "GET", base))["durable_grants"] is False
    put = await ok(client, "PUT", base, {"durable_grants": True})
    assert put["durable_grants"] is True and put["mode"] == "lease"
    assert (await ok(client, "GET", base))["durable_grants"] is True
    # Fields left out keep their value; null counts as left out (its type includes null).
    assert (await ok(client, "PUT", base, {"max_attempts": 3}))["durable_grants"] is True
    assert (await ok(client, "PUT", base, {"durable_grants": None}))["durable_grants"] is True
    status, out = await call(client, "PUT", base, {"durable_grants": "yes"})
    assert_error(status, out, 400, "invalid_parameter")
    # Riding completions work the same under it.
    t = (await lease(client, base))["records"][0]["token"]
    page = await lease(client, base, complete=[t])
    assert page["completed"] == [t] and len(page["records"]) == 1
    assert (await ok(client, "PUT", base, {"durable_grants": False}))["durable_grants"] is False


async def test_a_prefix_consumers_durable_grants_reaches_each_queues_consumer(node, client):
    """work-queues.md: a prefix consumer's `durable_grants` "is the lease consumer setting of
    that name, which each queue's consumer takes"."""
    prefix = f"dg{uuid.uuid4().hex[:6]}-"
    name = "pool"
    put = await ok(client, "PUT", f"{node.url}/v1/prefix-consumers/{name}",
                   {"prefix": prefix, "durable_grants": True})
    assert put["durable_grants"] is True
    got = await ok(client, "GET", f"{node.url}/v1/prefix-consumers/{name}")
    assert got["durable_grants"] is True
    q = f"{prefix}a"
    await fill(client, node, q, 1)
    page = await ok(client, "POST", f"{node.url}/v1/prefix-consumers/{name}/lease",
                    {"max_records": 5})
    assert [r["queue"] for r in page["records"]] == [q]
    settings = await ok(client, "GET", consumer_base(node, q, name))
    assert settings["durable_grants"] is True and settings["prefix"] == prefix
    await ok(client, "DELETE", f"{node.url}/v1/prefix-consumers/{name}")


# --- prefix leases ---------------------------------------------------------------------------

async def test_a_prefix_lease_completes_queue_token_pairs_token_by_token(node, client):
    """work-queues.md: a prefix lease may carry `complete: [{queue, token}]`, answered with
    `completed: [{queue, token}]` and `refused: [{queue, token, code}]`; a queue not under the
    prefix is `400 invalid_parameter` for the whole call, before anything is done."""
    prefix = f"rp{uuid.uuid4().hex[:6]}-"
    name = "riders"
    root = f"{node.url}/v1/prefix-consumers/{name}"
    await ok(client, "PUT", root, {"prefix": prefix})
    qa, qb = f"{prefix}a", f"{prefix}b"
    await fill(client, node, qa, 2)
    await fill(client, node, qb, 2)
    first = (await ok(client, "POST", f"{root}/lease", {"max_records": 10}))["records"]
    assert sorted(r["queue"] for r in first) == [qa, qa, qb, qb]
    pairs = [{"queue": r["queue"], "token": r["token"]} for r in first]

    outside = [*pairs, {"queue": qname("elsewhere"), "token": NEVER_GRANTED}]
    status, out = await call(client, "POST", f"{root}/lease", {"complete": outside})
    assert_error(status, out, 400, "invalid_parameter")
    assert [(await counts(client, node, q, name))["in_flight"] for q in (qa, qb)] == [2, 2]

    bad = {"queue": qa, "token": "nope"}
    # A grant nobody made for one of qb's records, sent before its real token completes it.
    never = {"queue": qb, "token": forged(next(p["token"] for p in pairs if p["queue"] == qb))}
    page = await ok(client, "POST", f"{root}/lease",
                    {"max_records": 10, "complete": [never, *pairs, bad]})
    key = lambda p: (p["queue"], p["token"])  # noqa: E731
    assert sorted(page["completed"], key=key) == sorted(pairs, key=key)
    assert sorted(page["refused"], key=key) == sorted(
        [{**bad, "code": "invalid_token"}, {**never, "code": "lease_expired"}], key=key)
    assert page["records"] == []
    for q in (qa, qb):
        assert (await counts(client, node, q, name))["lag"] == 0
    await ok(client, "DELETE", root)


async def test_a_prefix_lease_over_the_token_limit_is_refused(node, client):
    """work-queues.md: a prefix lease's `complete` holds at most 10,000 pairs."""
    prefix = f"rl{uuid.uuid4().hex[:6]}-"
    root = f"{node.url}/v1/prefix-consumers/lim"
    await ok(client, "PUT", root, {"prefix": prefix})
    over = [{"queue": f"{prefix}a", "token": f"{i}.1"} for i in range(MAX_RIDING + 1)]
    status, out = await call(client, "POST", f"{root}/lease", {"complete": over})
    assert_error(status, out, 400, "limit_out_of_range")
    await ok(client, "DELETE", root)


# --- the OpenAPI document --------------------------------------------------------------------

def resolve(doc: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    out: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        out = out[part]
    return dict(out)


async def test_the_served_openapi_document_describes_riding_completions(node, client):
    doc = await ok(client, "GET", f"{node.url}/v1/openapi.json")
    lease_op = doc["paths"]["/v1/queues/{queue}/consumers/{consumer}/lease"]["post"]
    req = resolve(doc, lease_op["requestBody"]["content"]["application/json"]["schema"])
    complete = req["properties"]["complete"]
    assert complete["maxItems"] == MAX_RIDING and "array" in complete["type"]
    page = resolve(doc, lease_op["responses"]["200"]["content"]["application/json"]["schema"])
    assert {"completed", "refused"} <= set(page["properties"])
    prefix_op = doc["paths"]["/v1/prefix-consumers/{consumer}/lease"]["post"]
    preq = resolve(doc, prefix_op["requestBody"]["content"]["application/json"]["schema"])
    assert preq["properties"]["complete"]["maxItems"] == MAX_RIDING
    settings_op = doc["paths"]["/v1/queues/{queue}/consumers/{consumer}"]["put"]
    sreq = resolve(doc, settings_op["requestBody"]["content"]["application/json"]["schema"])
    assert sreq["properties"]["durable_grants"]["default"] is False
    sans = resolve(doc, settings_op["responses"]["200"]["content"]["application/json"]["schema"])
    assert "durable_grants" in sans["properties"]
    pput = doc["paths"]["/v1/prefix-consumers/{consumer}"]["put"]
    preq2 = resolve(doc, pput["requestBody"]["content"]["application/json"]["schema"])
    assert "durable_grants" in preq2["properties"]


# --- the WebSocket stream's credit frame -----------------------------------------------------

async def frames_until_result(ws: aiohttp.ClientWebSocketResponse
                              ) -> tuple[list[Any], dict[str, Any]]:
    """The records pushed before the next result or error frame, and that frame."""
    records: list[Any] = []
    while True:
        frame = await ws.receive_json(timeout=10)
        if frame["type"] in ("result", "error"):
            return records, frame
        assert frame["type"] == "records", frame
        records += frame["records"]


async def quiet(ws: aiohttp.ClientWebSocketResponse, seconds: float = 0.3) -> Any:
    try:
        return await ws.receive_json(timeout=seconds)
    except TimeoutError:
        return None


async def test_a_credit_frame_carries_completions_answered_token_by_token(node, client):
    """work-queues.md: a credit may carry `complete`; the credit is added at once; one result
    frame `{"type": "result", "id", "op": "credit", "result": {"completed", "refused"}}`;
    repeats dropped; a credit without `complete` is answered by nothing."""
    q = qname("credit")
    await fill(client, node, q, 6)
    url = f"{node.url.replace('http', 'ws')}/v1/queues/{q}/consumers/w/stream?mode=lease"
    async with client.ws_connect(url) as ws:
        await ws.send_json({"op": "credit", "n": 3})
        got: list[Any] = []
        while len(got) < 3:
            frame = await ws.receive_json(timeout=10)
            assert frame["type"] == "records", frame
            got += frame["records"]
        assert await quiet(ws) is None  # a plain credit: no answer
        tokens = [r["token"] for r in got[:2]]
        never = forged(got[2]["token"])  # record 2 stays leased under its real token
        await ws.send_json({"op": "credit", "n": 2, "id": "c1",
                            "complete": [*tokens, tokens[0], "junk", never]})
        pushed, result = await frames_until_result(ws)
        assert (result["type"], result["id"], result["op"]) == ("result", "c1", "credit")
        assert sorted(result["result"]["completed"]) == sorted(tokens)
        assert sorted(result["result"]["refused"], key=lambda r: r["token"]) == sorted(
            [{"token": "junk", "code": "invalid_token"},
             {"token": never, "code": "lease_expired"}], key=lambda r: r["token"])
        while len(pushed) < 2:
            frame = await ws.receive_json(timeout=10)
            assert frame["type"] == "records", frame
            pushed += frame["records"]
        assert [r["value"] for r in pushed] == ["v3", "v4"]
    c = await counts(client, node, q)
    assert c["offset"] == got[1]["offset"] + 1


@pytest.mark.parametrize(("frame", "status", "code"), [
    ({"op": "credit", "n": 1, "id": 7, "complete": "0.1"}, 400, "invalid_token"),
    ({"op": "credit", "n": 1, "id": 7, "complete": [1]}, 400, "invalid_token"),
    ({"op": "credit", "n": 1, "id": 7, "complete": [f"{i}.1" for i in range(MAX_RIDING + 1)]},
     400, "limit_out_of_range"),
])
async def test_a_refused_credit_frame_adds_no_credit(node, client, frame, status, code):
    """work-queues.md: "A frame the node refuses before adding the credit is an `error` frame
    and adds none of its credit": `complete` not a list of strings (`400 invalid_token`) or
    over 10,000 tokens (`400 limit_out_of_range`)."""
    q = qname("refusedcredit")
    await fill(client, node, q, 2)
    url = f"{node.url.replace('http', 'ws')}/v1/queues/{q}/consumers/w/stream?mode=lease"
    async with client.ws_connect(url) as ws:
        await ws.send_json(frame)
        answer = await ws.receive_json(timeout=10)
        assert answer["type"] == "error" and answer["id"] == 7 and answer["op"] == "credit"
        assert answer["error"]["code"] == code and answer["error"]["retriable"] is False
        assert not answer.get("final")
        assert await quiet(ws, 0.5) is None  # no credit: no records
        await ws.send_json({"op": "credit", "n": 1})  # the stream goes on
        pushed = await ws.receive_json(timeout=10)
        assert pushed["type"] == "records" and len(pushed["records"]) == 1
    assert status == 400


async def test_complete_on_a_cursor_streams_credit_is_a_mode_mismatch(node, client):
    q = qname("cursorstream")
    await fill(client, node, q, 1)
    url = f"{node.url.replace('http', 'ws')}/v1/queues/{q}/consumers/r/stream?mode=cursor"
    async with client.ws_connect(url) as ws:
        await ws.send_json({"op": "credit", "n": 1, "id": 1, "complete": [NEVER_GRANTED]})
        answer = await ws.receive_json(timeout=10)
        assert answer["type"] == "error" and answer["id"] == 1
        assert answer["error"]["code"] == "consumer_mode_mismatch"
        assert await quiet(ws, 0.5) is None  # refused before the credit was added


# --- the Python client -----------------------------------------------------------------------

async def test_the_python_clients_lease_with_complete_returns_completed_and_refused(node):
    """clients/python/README.md: `lease(..., complete=[leases or tokens])` returns a LeasePage,
    a list of Lease, with `completed` (tokens) and `refused` (Refused(token, code)); without
    `complete=` both are empty."""
    q = qname("pyclient")
    async with AsyncClient(node.url) as vq:
        await vq.enqueue(q, ["a", "b", "c", "d"])
        first = await vq.lease(q, "w", max_records=2)
        assert first.completed == [] and first.refused == []
        mixed: list[Lease | str] = [first[0], first[1].token, "bad"]
        page = await vq.lease(q, "w", max_records=2, complete=mixed)
        assert all(isinstance(x, Lease) for x in page)
        assert [x.text for x in page] == ["c", "d"]
        assert sorted(page.completed) == sorted([first[0].token, first[1].token])
        assert [(r.token, r.code) for r in page.refused] == [("bad", "invalid_token")]
    with Client(node.url) as sync:
        done = sync.lease(q, "w", complete=[x.token for x in page])
        assert sorted(done.completed) == sorted(x.token for x in page) and list(done) == []


async def test_the_workers_on_refused_hook_gets_each_refused_completion(node):
    """clients/python/README.md: "A completion the node refuses is reported token by token:
    `on_refused(lease, code)` ...; `worker.refused` counts them"."""
    q = qname("hook")
    refused: list[tuple[str, str]] = []
    first_tokens: list[str] = []
    stolen: list[Lease] = []
    async with AsyncClient(node.url) as vq:
        await vq.enqueue(q, ["only"])

        async def handle(job: Lease) -> None:
            if job.attempt > 1:
                return
            # Give the record back and have it leased again: the worker's token is stale.
            first_tokens.append(job.token)
            await vq.retry(q, "w", job, delay_ms=0)
            stolen.extend(await vq.lease(q, "w", visibility_ms=60_000))

        worker = Worker(vq, q, "w", handle, concurrency=1, wait_ms=200,
                        on_refused=lambda lease, code: refused.append((lease.token, code)))
        runner = asyncio.create_task(worker.run())
        for _ in range(100):
            if refused:
                break
            await asyncio.sleep(0.05)
        await worker.stop()
        await runner
        assert refused == [(first_tokens[0], "lease_expired")]
        assert worker.refused == 1
        if stolen:  # the hand-held lease is untouched and still completes
            assert (await vq.complete(q, "w", stolen))["done"] == [stolen[0].token]


async def test_a_worker_completes_every_record_once(node):
    """clients/python/README.md: finished records' tokens ride on the next lease (or a
    standalone complete after complete_delay_ms, and on stop): every record is done once."""
    q = qname("worker")
    seen: list[str] = []
    async with AsyncClient(node.url) as vq:
        await vq.enqueue(q, [f"j{i}" for i in range(200)])

        async def handle(job: Lease) -> None:
            assert job.text is not None
            seen.append(job.text)

        worker = Worker(vq, q, "w", handle, concurrency=4, wait_ms=200)
        runner = asyncio.create_task(worker.run())
        for _ in range(200):
            if len(seen) >= 200:
                break
            await asyncio.sleep(0.05)
        await worker.stop()
        await runner
        assert sorted(seen) == sorted(f"j{i}" for i in range(200))
        info = await vq.queue_info(q)
        assert info is not None
        w = next(c for c in info["consumers"] if c["consumer"] == "w")
        assert (w["lag"], w["in_flight"]) == (0, 0)


# --- what survives a failover ----------------------------------------------------------------

async def test_riding_completions_and_durable_grants_survive_a_sigkill(bootstrap, client):
    """work-queues.md, What survives a failover: no record whose completion was answered
    (riding on a lease too) is delivered again; a token the new owner never saw is refused
    `lease_expired`; with `durable_grants` a record leased before the failure is not handed to
    another worker before its deadline, and its token still works with the new owner."""
    t = create_topics(bootstrap, partitions=2)
    q_default, q_durable = qname("fo"), qname("fod")
    node = NodeProcess(t).start()
    try:
        await ok(client, "PUT", consumer_base(node, q_durable), {"mode": "lease",
                                                                 "durable_grants": True})
        await fill(client, node, q_default, 10)
        await fill(client, node, q_durable, 10)
        done: dict[str, set[int]] = {}
        held: dict[str, list[Any]] = {}
        for q in (q_default, q_durable):
            base = consumer_base(node, q)
            first = (await lease(client, base, max_records=6, visibility_ms=60_000))["records"]
            page = await lease(client, base, max_records=2, visibility_ms=60_000,
                               complete=[r["token"] for r in first[:4]])
            assert len(page["completed"]) == 4
            done[q] = {r["offset"] for r in first[:4]}
            held[q] = first[4:] + page["records"]
    finally:
        assert node.kill() == -9  # right after the answers: nothing flushed on the way out
    node = NodeProcess(t, port=node.port).start()
    # A fresh session: the old one's kept-alive connections went with the killed node.
    async with aiohttp.ClientSession() as client:
        await after_failover(client, node, q_default, q_durable, done, held)


async def after_failover(client: aiohttp.ClientSession, node: NodeProcess, q_default: str,
                         q_durable: str, done: dict[str, set[int]],
                         held: dict[str, list[Any]]) -> None:
    try:
        # Durable grants: the held records are not handed out again; their tokens work.
        base = consumer_base(node, q_durable)
        rest = (await lease(client, base, max_records=50))["records"]
        offsets = {r["offset"] for r in rest}
        assert not offsets & done[q_durable], "a completed record came again"
        assert not offsets & {r["offset"] for r in held[q_durable]}, "a held record came again"
        page = await lease(client, base, complete=[r["token"] for r in held[q_durable] + rest])
        assert page["refused"] == [] and len(page["completed"]) == 10 - len(done[q_durable])
        assert (await counts(client, node, q_durable))["lag"] == 0
        # Grants written behind: completed records never come again; every other one may.
        base = consumer_base(node, q_default)
        rest = (await lease(client, base, max_records=50))["records"]
        assert not {r["offset"] for r in rest} & done[q_default], "a completed record came again"
        page = await lease(client, base, complete=[r["token"] for r in rest])
        assert page["refused"] == []
        # An old grant's token is either kept (its write landed) or refused lease_expired.
        old = await lease(client, base, complete=[r["token"] for r in held[q_default]])
        for r in old["refused"]:
            assert r["code"] == "lease_expired"
        assert len(old["completed"]) + len(old["refused"]) == len(held[q_default])
        assert (await counts(client, node, q_default))["lag"] == 0
    finally:
        node.terminate()
