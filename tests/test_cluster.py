"""A 3-node cluster: the map, wrong_node, --forward, the Python client, the admin script."""

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import cast

import pytest
from vqueues_client import AsyncClient, BatchProducer, Client, NewRecord, consume
from vqueues_client.types import Value

from tests.narrow import known
from tests.support import create_topics, cursor_counts, http, start_cluster
from vqueues.hashing import partition_for

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 12


@pytest.fixture(scope="module")
def cluster(bootstrap):
    t = create_topics(bootstrap, partitions=PARTITIONS)
    nodes = start_cluster(t, 3, env={2: {"VQ_FORWARD": "1"}})
    try:
        yield nodes
    finally:
        for n in nodes:
            n.terminate()


def owners(node):
    body = http("GET", f"{node.url}/v1/partitions")[1]
    return {int(p): o for p, o in body["owners"].items()}, body


def test_every_node_serves_the_same_map_covering_every_partition(cluster):
    maps = [owners(n) for n in cluster]
    first, body = maps[0]
    assert body["partitions"] == PARTITIONS and body["generation"] >= 1
    assert sorted(first) == list(range(PARTITIONS))
    assert {o["url"] for o in first.values()} == {n.url for n in cluster}
    assert all(m == first for m, _ in maps)
    for n in cluster:
        mine = http("GET", f"{n.url}/v1/partitions")[1]["owned"]
        assert mine == sorted(p for p, o in first.items() if o["url"] == n.url)


def queue_owned_by(cluster, node):
    m, _ = owners(cluster[0])
    return next(f"q-{i}" for i in range(10**6)
                if m[partition_for(f"q-{i}", PARTITIONS)]["url"] == node.url)


def test_a_non_owner_answers_409_naming_the_partition_and_the_owners_url(cluster):
    a, b, _ = cluster
    q = queue_owned_by(cluster, a)
    status, body = http("POST", f"{b.url}/v1/queues/{q}/records", {"records": [{"value": "x"}]})
    assert status == 409
    err = body["error"]
    assert err["code"] == "wrong_node"
    assert err["partition"] == partition_for(q, PARTITIONS)
    assert err["owner"] == a.url and err["owner_node"] == "node-0"


def test_a_forwarding_node_proxies_requests_to_the_owner(cluster):
    a, _, fwd = cluster
    q = queue_owned_by(cluster, a)
    status, body = http("POST", f"{fwd.url}/v1/queues/{q}/records",
                        {"records": [{"value": "via proxy"}]})
    assert status == 200, body
    status, body = http("GET", f"{fwd.url}/v1/queues/{q}/records?wait_ms=1000")
    assert status == 200 and [r["value"] for r in body["records"]] == ["via proxy"]
    status, body = http("GET", f"{a.url}/v1/queues/{q}")
    assert status == 200 and body["records"] == 1
    # Errors from the owner come back as they are.
    status, body = http("POST", f"{fwd.url}/v1/queues/{q}/consumers/c/ack", {"offset": -1})
    assert (status, body["error"]["code"]) == (400, "invalid_offset")


async def test_the_client_routes_every_queue_to_its_owner(cluster):
    async with AsyncClient(cluster[1].url) as vq:
        queues = [f"routed-{uuid.uuid4().hex[:6]}-{i}" for i in range(30)]
        for q in queues:
            res = await vq.enqueue(q, [q, b"\xffbytes"], headers={"h": "1"})
            assert res.partition == partition_for(q, PARTITIONS)
        assert len({vq.owners[partition_for(q, PARTITIONS)] for q in queues}) == 3
        for q in queues:
            page = await vq.read(q)
            assert [r.value for r in page.records] == [q.encode(), b"\xffbytes"]
            assert page.records[0].headers == {"h": "1"}


async def test_the_client_recovers_from_a_stale_map(cluster):
    async with AsyncClient(cluster[0].url, refresh_interval_s=3600) as vq:
        await vq.refresh_map()
        q = f"stale-{uuid.uuid4().hex[:6]}"
        p = partition_for(q, PARTITIONS)
        right = vq.owners[p]
        vq.owners = {k: next(n.url for n in cluster if n.url != right and "VQ_FORWARD" not in
                             n.extra_env) for k in vq.owners}
        res = await vq.enqueue(q, "found its way")
        assert res.offsets and vq.owners[p] == right


async def test_batch_producer_and_consume_deliver_every_record_once(cluster):
    q = f"batch-{uuid.uuid4().hex[:6]}"
    async with AsyncClient([n.url for n in cluster]) as vq:
        async with BatchProducer(vq, linger_ms=5, max_batch=100) as producer:
            # The node acknowledges writes (acks is not 0): every send answers its offset.
            offsets = cast(list[int], await asyncio.gather(
                *(producer.send(q, f"m{i}") for i in range(250))))
        assert len(set(offsets)) == 250 and offsets == sorted(offsets)
        seen = []

        async def handler(rec):
            seen.append(rec.text)

        handled = await consume(vq, q, "worker", handler, limit=60, wait_ms=500,
                                max_records=250)
        assert handled == 250 and seen == [f"m{i}" for i in range(250)]
        info = known(await vq.queue_info(q))
        assert info["consumers"] == [{"consumer": "worker", "offset": offsets[-1] + 1, "lag": 0,
                                     **cursor_counts(0)}]


async def test_a_failing_handler_leaves_its_record_for_the_next_consume(cluster):
    q = f"fail-{uuid.uuid4().hex[:6]}"
    async with AsyncClient(cluster[0].url) as vq:
        await vq.enqueue(q, ["a", "b", "c"])

        def explode_on_b(rec):
            if rec.text == "b":
                raise RuntimeError("boom")

        with pytest.raises(RuntimeError):
            await consume(vq, q, "w", explode_on_b, wait_ms=200)
        page = await vq.read(q, consumer="w")
        assert [r.text for r in page.records] == ["b", "c"]


def test_the_sync_client_works_without_an_event_loop(cluster):
    q = f"sync-{uuid.uuid4().hex[:6]}"
    with Client([n.url for n in cluster]) as vq:
        vq.enqueue(q, ["one", "two"])
        page = vq.read(q, consumer="s")
        assert [r.text for r in page.records] == ["one", "two"]
        vq.ack(q, "s", page.next_offset)
        assert known(vq.queue_info(q))["consumers"][0]["lag"] == 0
        assert known(vq.delete_queue(q))["records"] == 2
        assert vq.queue_info(q) is None


def delete_queue_script(*args, stdin=None):
    return subprocess.run([sys.executable, str(ROOT / "scripts/delete_queue.py"), *args],
                          capture_output=True, text=True, timeout=120, input=stdin,
                          env={**os.environ})


def test_the_admin_script_shows_then_deletes_queues_on_their_owning_nodes(cluster):
    run = uuid.uuid4().hex[:6]
    queues = []
    with Client(cluster[0].url) as vq:
        owner_of = owners(cluster[0])[0]
        for node in cluster:  # one queue on each node
            q = next(f"adm-{run}-{i}" for i in range(10**5)
                     if owner_of[partition_for(f"adm-{run}-{i}", PARTITIONS)]["url"] == node.url)
            queues.append(q)
            vq.enqueue(q, ["x", "y"])
            vq.ack(q, "reader", 0)
    url = cluster[1].url
    dry = delete_queue_script("--url", url, "--dry-run", *queues)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    for q in queues:
        assert f"{q}: partition" in dry.stdout and "2 record(s)" in dry.stdout
        assert f"{q}: would be deleted (dry run)" in dry.stdout
        assert http("GET", f"{url}/v1/queues/{q}")[0] in (200, 409)
    refused = delete_queue_script("--url", url, *queues, stdin="")
    assert refused.returncode == 1 and "refusing to delete without --yes" in refused.stderr
    done = delete_queue_script("--url", url, "--yes", *queues)
    assert done.returncode == 0, done.stdout + done.stderr
    for q in queues:
        assert f"{q}: deleted (2 record(s), 1 consumer(s)" in done.stdout
    with Client(url) as vq:
        assert all(vq.queue_info(q) is None for q in queues)
    missing = delete_queue_script("--url", url, "--yes", queues[0], f"never-{run}")
    assert missing.returncode == 1
    assert f"never-{run}: not found" in missing.stdout
    ok = delete_queue_script("--url", url, "--yes", "--ignore-missing", f"never-{run}")
    assert ok.returncode == 0


def test_the_admin_cli_lists_queues_and_nodes_across_the_cluster(cluster):
    run = uuid.uuid4().hex[:6]
    owner_of = owners(cluster[0])[0]
    with Client(cluster[0].url) as vq:
        queues = []
        for node in cluster:  # one queue on each node
            q = next(f"cli-{run}-{i}" for i in range(10**5)
                     if owner_of[partition_for(f"cli-{run}-{i}", PARTITIONS)]["url"] == node.url)
            queues.append(q)
            vq.enqueue(q, ["x"])

    def cli(*args):
        done = subprocess.run([sys.executable, "-m", "vqueues", *args, "--json",
                               "--url", cluster[1].url], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)

    listed = cli("queues", "list", "--prefix", f"cli-{run}-")
    assert [r["queue"] for r in listed] == sorted(queues)
    info = cli("cluster")
    assert sorted(n["url"] for n in info["nodes"]) == sorted(n.url for n in cluster)
    assert sum(len(n["details"]) for n in info["nodes"]) == PARTITIONS


# The multi-queue enqueue (POST /v1/records) ------------------------------------------------

def owner_urls(node) -> dict[int, str]:
    body = http("GET", f"{node.url}/v1/partitions")[1]
    return {int(p): o["url"] for p, o in body["owners"].items()}


def values(node_url: str, queue: str) -> list[str]:
    status, body = http("GET", f"{node_url}/v1/queues/{queue}/records?limit=1000")
    assert status == 200, body
    return [r["value"] for r in body["records"]]


def test_each_record_is_answered_on_its_own_and_each_queue_keeps_its_order(cluster):
    a = cluster[0]
    owners = owner_urls(a)
    run = uuid.uuid4().hex[:6]
    queues = [f"mq-{run}-{i}" for i in range(40)]
    records = [{"queue": q, "value": f"{q}:{k}"} for k in range(3) for q in queues]
    status, body = http("POST", f"{a.url}/v1/records", {"records": records})
    assert status == 200, body
    results = body["results"]
    assert [r["queue"] for r in results] == [r["queue"] for r in records]
    mine = {q for q in queues if owners[partition_for(q, PARTITIONS)] == a.url}
    assert mine and len(mine) < len(queues)
    for rec, res in zip(records, results, strict=True):
        q = rec["queue"]
        assert res["partition"] == partition_for(q, PARTITIONS)
        if q in mine:
            assert isinstance(res["offset"], int) and "error" not in res
        else:
            assert res["status"] == 409 and res["error"]["code"] == "wrong_node"
            assert res["error"]["retriable"] is True
            assert res["error"]["owner"] == owners[res["partition"]]
    assert body["written"] == 3 * len(mine) and body["failed"] == len(records) - body["written"]
    for q in mine:
        offsets = [r["offset"] for r in results if r["queue"] == q]
        assert offsets == sorted(offsets)
        assert values(a.url, q) == [f"{q}:{k}" for k in range(3)]  # readable at once, in order
    for q in set(queues) - mine:
        assert values(owners[partition_for(q, PARTITIONS)], q) == []  # nothing written


def test_a_forwarding_node_writes_every_record_through_the_owners(cluster):
    fwd = cluster[2]
    run = uuid.uuid4().hex[:6]
    queues = [f"fw-{run}-{i}" for i in range(30)]
    records = [{"queue": q, "value": f"{q}:{k}", "headers": {"k": str(k)}}
               for k in range(2) for q in queues]
    status, body = http("POST", f"{fwd.url}/v1/records", {"records": records})
    assert status == 200, body
    assert body["failed"] == 0 and body["written"] == len(records)
    owners = owner_urls(fwd)
    assert len({owners[partition_for(q, PARTITIONS)] for q in queues}) == 3
    for q in queues:
        assert values(owners[partition_for(q, PARTITIONS)], q) == [f"{q}:0", f"{q}:1"]


def test_a_forwarded_refusal_names_the_record_by_its_place_in_the_request(cluster):
    fwd = cluster[2]
    owners = owner_urls(fwd)
    run = uuid.uuid4().hex[:6]
    # a queue another node owns, behind records the forwarding node keeps or sends elsewhere
    far = next(q for q in (f"fwk-{run}-{i}" for i in range(200))
               if owners[partition_for(q, PARTITIONS)] != fwd.url)
    filler = [{"queue": f"fwf-{run}-{i}", "value": "x"} for i in range(5)]
    records = [*filler, {"queue": far, "value": "a", "idempotency_key": "k"},
               {"queue": far, "value": "b", "idempotency_key": "k"}]
    status, body = http("POST", f"{fwd.url}/v1/records", {"records": records})
    assert status == 200, body
    error = body["results"][6]["error"]
    assert error["code"] == "idempotency_key_reused"
    assert (error["index"], error["first_index"]) == (6, 5)
    assert error["message"].startswith("records[6]: ") and "records[5] of this" in \
        error["message"]
    assert body["results"][5]["error"] == error  # a queue's records fail together
    assert body["written"] == 5


@pytest.mark.parametrize(("records", "code"), [
    ([{"value": "no queue"}], "invalid_record"),
    ([{"queue": 7, "value": "x"}], "invalid_record"),
    ([{"queue": "", "value": "x"}], "invalid_name"),
    ([{"queue": "ok", "value": "x", "colour": "red"}], "invalid_record"),
    ([{"queue": "ok", "value": 5}], "invalid_record"),
    ([{"queue": "ok", "value": "x", "delay_ms": -1}], "limit_out_of_range"),
    ([], "invalid_records"),
    ([{"queue": "ok", "value": "x"}] * 1001, "too_many_records"),
])
def test_a_request_wrong_as_a_whole_is_refused_and_writes_nothing(cluster, records, code):
    a = cluster[0]
    q = f"whole-{uuid.uuid4().hex[:6]}"
    good = {"queue": q, "value": "must not be written"}
    status, body = http("POST", f"{a.url}/v1/records", {"records": [good, *records]}
                        if records else {"records": []})
    assert status == 400 and body["error"]["code"] == code, body
    assert body["error"]["retriable"] is False
    owner = owner_urls(a)[partition_for(q, PARTITIONS)]
    assert values(owner, q) == []


def test_idempotency_keys_hold_across_queues_in_one_call(cluster):
    a = cluster[0]
    owners = owner_urls(a)
    run = uuid.uuid4().hex[:6]
    queues = [q for q in (f"idem-{run}-{i}" for i in range(60))
              if owners[partition_for(q, PARTITIONS)] == a.url][:5]
    records = [{"queue": q, "value": f"{q}:{k}", "idempotency_key": f"{q}-{k}"}
               for q in queues for k in range(2)]
    first = http("POST", f"{a.url}/v1/records", {"records": records})[1]
    again = http("POST", f"{a.url}/v1/records", {"records": records})[1]
    assert first["failed"] == 0 and again["failed"] == 0
    assert [r["offset"] for r in first["results"]] == [r["offset"] for r in again["results"]]
    for q in queues:
        assert values(a.url, q) == [f"{q}:0", f"{q}:1"]
    clash = [{"queue": queues[0], "value": "other", "idempotency_key": f"{queues[0]}-0"},
             {"queue": queues[1], "value": "fresh"}]
    body = http("POST", f"{a.url}/v1/records", {"records": clash})[1]
    assert body["results"][0]["error"]["code"] == "idempotency_key_reused"
    assert body["results"][0]["status"] == 409
    assert isinstance(body["results"][1]["offset"], int)  # another queue is not held back


async def test_enqueue_many_sends_one_call_per_owner_and_follows_a_stale_map(cluster):
    run = uuid.uuid4().hex[:6]
    queues = [f"em-{run}-{i}" for i in range(50)]
    items: list[tuple[str, Value | NewRecord]] = [(q, f"{q}:{k}") for k in range(4) for q in queues]
    items.append((queues[0], NewRecord(b"\x00bytes", {"h": "v"}, tags=["t"])))
    async with AsyncClient(cluster[0].url, refresh_interval_s=3600) as vq:
        await vq.refresh_map()
        # Every partition's owner wrong: each record is first refused with wrong_node, then
        # sent to its owner after the map is refreshed.
        urls = sorted(set(vq.owners.values()))
        vq.owners = {p: urls[(urls.index(u) + 1) % len(urls)] for p, u in vq.owners.items()}
        results = await vq.enqueue_many(items)
    assert all(r.ok for r in results), [r.error for r in results if not r.ok][:3]
    assert [r.queue for r in results] == [q for q, _ in items]
    owners = owner_urls(cluster[0])
    for q in queues:
        expected = [f"{q}:{k}" for k in range(4)]
        got = values(owners[partition_for(q, PARTITIONS)], q)
        assert got[:4] == expected
        offsets = [known(r.offset) for r in results if r.queue == q]
        assert offsets == sorted(offsets)


async def test_the_batch_producer_keeps_each_queues_order_over_many_queues(cluster):
    run = uuid.uuid4().hex[:6]
    queues = [f"bp-{run}-{i}" for i in range(200)]
    async with AsyncClient([n.url for n in cluster[:2]]) as vq:
        async with BatchProducer(vq, linger_ms=5, max_batch=500) as producer:
            sent: list[asyncio.Future[int | None]] = []
            for k in range(5):
                sent.extend(producer.send_nowait(q, f"{q}:{k}") for q in queues)
                await asyncio.sleep(0.001)
            offsets = cast(list[int], await asyncio.gather(*sent))  # acks is not 0: all known
        # 1,000 records to 200 queues over 3 owners: a few multi-queue calls, not one per
        # queue and batch.
        assert producer.requests <= 20, producer.requests
    owners = owner_urls(cluster[0])
    by_queue: dict[str, list[int]] = {}
    for q, off in zip((q for _ in range(5) for q in queues), offsets, strict=True):
        by_queue.setdefault(q, []).append(off)
    for q in queues:
        assert by_queue[q] == sorted(by_queue[q])
        assert values(owners[partition_for(q, PARTITIONS)], q) == [f"{q}:{k}" for k in range(5)]
