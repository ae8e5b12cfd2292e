"""The outbox against a real PostgreSQL and a real node: the schema, the helper, and the relay
run as a library (docs/outbox.md)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from vqueues_client import AsyncClient, VQError
from vqueues_client.outbox import add, add_async

from tests.outbox.relays import pending, scalar
from tests.support import http, vqueues_cli, wait_for
from vqueues.kafka.broker import free_port
from vqueues.outbox.relay import Relay, RelayMetrics, RelayOptions


def _q(name: str) -> str:
    return f"ob-{name}-{uuid.uuid4().hex[:6]}"


@asynccontextmanager
async def running_relay(dsn, node, **options):
    """A relay in this event loop until the block ends."""
    metrics = RelayMetrics()
    relay = Relay(RelayOptions(dsn=dsn, urls=[node.url], **options), metrics)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        yield relay
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


async def queue_records(node, queue):
    async with AsyncClient(node.url) as vq:
        try:
            page = await vq.read(queue, offset=0, limit=1000)
        except VQError as exc:
            if exc.code == "queue_not_found":
                return []
            raise
        return page.records


async def wait_records(node, queue, count, timeout_s=20.0):
    deadline = time.monotonic() + timeout_s
    while True:
        recs = await queue_records(node, queue)
        if len(recs) >= count or time.monotonic() > deadline:
            return recs
        await asyncio.sleep(0.1)


def test_install_command_is_idempotent(postgres):
    dsn = postgres.create_database(f"db_{uuid.uuid4().hex[:10]}")
    first = vqueues_cli("outbox", "install", "--dsn", dsn)
    assert first.returncode == 0, first.stderr
    with psycopg.connect(dsn) as conn:
        add(conn, "q", "kept")
    second = vqueues_cli("outbox", "install", "--dsn", dsn)
    assert second.returncode == 0, second.stderr
    assert first.stdout == second.stdout  # the same namespace, printed
    assert "namespace" in first.stdout
    assert pending(dsn) == 1  # a second install keeps the rows


def test_helper_refuses_bad_records_and_the_transaction_fails(outbox_dsn):
    too_big = b"x" * (1024 * 1024 + 1)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"queue": ""}, "invalid_name"),
        ({"queue": "a\x01b"}, "invalid_name"),
        ({"queue": "x" * 250}, "invalid_name"),
        ({"value": too_big}, "record_too_large"),
        ({"tags": ["a,b"]}, "invalid_record"),
        ({"tags": [" red"]}, "invalid_record"),
        ({"tags": [f"t{i}" for i in range(9)]}, "invalid_record"),
        ({"headers": {"vq-outbox-id": "x"}}, "invalid_record"),
        ({"idempotency_key": "k" * 257}, "invalid_record"),
        ({"delay_ms": -1}, "limit_out_of_range"),
    ]
    for change, code in cases:
        kw: dict[str, Any] = {"queue": "good", "value": "v", **change}
        with pytest.raises(VQError) as err, psycopg.connect(outbox_dsn) as conn, \
                conn.transaction():
            conn.execute("CREATE TEMP TABLE business (x int)")
            add(conn, kw.pop("queue"), kw.pop("value"), **kw)
        assert err.value.code == code, (change, err.value)
    assert pending(outbox_dsn) == 0
    # A direct INSERT is held to the rules SQL can state.
    with psycopg.connect(outbox_dsn) as conn, pytest.raises(psycopg.errors.CheckViolation):
        conn.execute("INSERT INTO vqueues_outbox.records (queue, tags) VALUES ('q', ARRAY['a,b'])")


async def test_committed_rows_arrive_once_rolled_back_never(outbox_dsn, node):
    queues = [_q("once") for _ in range(3)]
    expected: dict[str, list[str]] = {q: [] for q in queues}
    async with await psycopg.AsyncConnection.connect(outbox_dsn) as conn:
        for t in range(12):
            rollback = t % 4 == 3
            try:
                async with conn.transaction():
                    for i in range(5):
                        q = queues[(t + i) % 3]
                        value = f"t{t}-{i}"
                        await add_async(conn, q, value, headers={"h": value},
                                        ordering_key=f"k{i % 2}", tags=["red"])
                        if not rollback:
                            expected[q].append(value)
                    if rollback:
                        raise RuntimeError("roll back")
            except RuntimeError:
                pass
    async with running_relay(outbox_dsn, node) as relay:
        for q in queues:
            await wait_records(node, q, len(expected[q]))
        await asyncio.sleep(0.5)  # room for a duplicate to show
        got = {q: await queue_records(node, q) for q in queues}
    namespace = scalar(outbox_dsn, "SELECT namespace FROM vqueues_outbox.meta")
    for q in queues:
        assert [r.text for r in got[q]] == expected[q]
        for r in got[q]:
            assert r.headers["h"] == r.text
            assert r.headers["vq-tags"] == "red"
            assert r.headers["vq-ordering-key"] in ("k0", "k1")
            assert r.headers["vq-outbox-id"].startswith(f"{namespace}:")
    assert pending(outbox_dsn) == 0
    assert relay.metrics.relayed._value.get() == sum(len(v) for v in expected.values())
    assert scalar(outbox_dsn, "SELECT count(*) FROM vqueues_outbox.queues WHERE queue = ANY(%s) "
                  "AND sent_at IS NULL AND next_offset IS NOT NULL", (queues,)) == 3


async def test_per_queue_order_is_commit_order(outbox_dsn, node):
    """Two transactions write one queue: the second to start tries to commit first. Its insert
    waits for the first's commit (the queue's lock), so the rows arrive in commit order."""
    q = _q("order")
    async with await psycopg.AsyncConnection.connect(outbox_dsn) as a, \
            await psycopg.AsyncConnection.connect(outbox_dsn) as b:
        await a.execute("BEGIN")
        await add_async(a, q, "a")

        async def writer_b():
            await b.execute("BEGIN")
            await add_async(b, q, "b")
            await b.execute("COMMIT")

        task = asyncio.create_task(writer_b())
        await asyncio.sleep(0.5)
        b_committed_first = task.done()
        await a.execute("COMMIT")
        await task
    commits = ["b", "a"] if b_committed_first else ["a", "b"]
    async with running_relay(outbox_dsn, node):
        recs = await wait_records(node, q, 2)
    assert [r.text for r in recs] == commits


async def test_delayed_row_waits_for_its_due_time(outbox_dsn, node):
    q = _q("delay")
    async with await psycopg.AsyncConnection.connect(outbox_dsn, autocommit=True) as conn:
        now = await (await conn.execute(
            "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint")).fetchone()
        assert now is not None
        start_ms = now[0]
        await add_async(conn, q, "later", delay_ms=1500)
        await add_async(conn, q, "now")
    async with running_relay(outbox_dsn, node, poll_ms=200):
        first = await wait_records(node, q, 1)
        assert [r.text for r in first] == ["now"]
        recs = await wait_records(node, q, 2)
    assert [r.text for r in recs] == ["now", "later"]
    assert recs[1].timestamp >= start_ms + 1500


async def test_a_row_the_node_refuses_goes_to_the_dead_rows(outbox_dsn, node):
    q = _q("dead")
    with psycopg.connect(outbox_dsn) as conn:
        add(conn, q, "before")
        # A tab around a tag passes SQL's check (btrim trims spaces), not the node's.
        conn.execute("INSERT INTO vqueues_outbox.records (queue, value, tags) "
                     "VALUES (%s, 'bad', ARRAY[E'red\\t'])", (q,))
        add(conn, q, "after")
    async with running_relay(outbox_dsn, node) as relay:
        recs = await wait_records(node, q, 2)
        wait_for(lambda: pending(outbox_dsn) == 0, 10)
    assert [r.text for r in recs] == ["before", "after"]
    assert relay.metrics.dead._value.get() == 1
    with psycopg.connect(outbox_dsn) as conn:
        dead = conn.execute("SELECT queue, value, error FROM vqueues_outbox.dead").fetchall()
    assert [(d[0], bytes(d[1])) for d in dead] == [(q, b"bad")]
    assert dead[0][2]["code"] == "invalid_record" and dead[0][2]["status"] == 400


async def test_a_notification_wakes_the_relay(outbox_dsn, node):
    """With a 60 s poll interval, a committed row still arrives at once: LISTEN/NOTIFY."""
    q = _q("notify")
    async with running_relay(outbox_dsn, node, poll_ms=60_000):
        await asyncio.sleep(0.5)  # the relay is waiting on LISTEN
        with psycopg.connect(outbox_dsn) as conn:
            add(conn, q, "woken")
        recs = await wait_records(node, q, 1, timeout_s=10)
    assert [r.text for r in recs] == ["woken"]


def test_relay_command_serves_metrics_and_stops_on_sigterm(outbox_dsn, node):
    q = _q("cmd")
    with psycopg.connect(outbox_dsn) as conn:
        for i in range(3):
            add(conn, q, f"v{i}")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vqueues", "outbox", "relay", "--dsn", outbox_dsn,
         "--url", node.url, "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=os.environ.copy())
    try:
        def relayed():
            status, text = http("GET", f"http://127.0.0.1:{port}/metrics")
            return status == 200 and "vq_outbox_rows_relayed_total 3.0" in str(text)
        wait_for(relayed, 30)
        _, text = http("GET", f"http://127.0.0.1:{port}/metrics")
        assert "vq_outbox_lag_seconds" in str(text)
        assert "vq_outbox_buckets_held 64.0" in str(text)
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert pending(outbox_dsn) == 0


async def test_rows_with_their_own_key_follow_the_nodes_key_rule(outbox_dsn, node):
    """Two rows with one key and one payload store one record; the same key with another
    payload is refused by the node, and that row goes to the dead rows."""
    q = _q("keyed")
    with psycopg.connect(outbox_dsn) as conn:
        add(conn, q, "same", idempotency_key="order-1")
    with psycopg.connect(outbox_dsn) as conn:
        add(conn, q, "same", idempotency_key="order-1")
        add(conn, q, "other", idempotency_key="order-1")
        add(conn, q, "free")
    async with running_relay(outbox_dsn, node):
        recs = await wait_records(node, q, 2)
        wait_for(lambda: pending(outbox_dsn) == 0, 10)
    assert [r.text for r in recs] == ["same", "free"]
    assert recs[0].headers["vq-idempotency-key"] == "order-1"
    assert "vq-outbox-id" not in recs[0].headers
    error = scalar(outbox_dsn, "SELECT error FROM vqueues_outbox.dead WHERE queue = %s", (q,))
    assert error["code"] == "idempotency_key_reused"


async def test_a_sqlalchemy_session_writes_in_its_transaction(outbox_dsn, node):
    sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy is not installed")
    from sqlalchemy.orm import Session

    q = _q("sqla")
    engine = sqlalchemy.create_engine("postgresql+psycopg://",
                                      creator=lambda: psycopg.connect(outbox_dsn))
    try:
        with Session(engine) as session, session.begin():
            add(session, q, "committed")
        with Session(engine) as session, session.begin():
            add(session, q, "rolled back")
            session.rollback()
        with engine.begin() as conn:
            add(conn, q, "by a connection")
    finally:
        engine.dispose()
    async with running_relay(outbox_dsn, node):
        recs = await wait_records(node, q, 2)
        await asyncio.sleep(0.3)
        recs = await queue_records(node, q)
    assert [r.text for r in recs] == ["committed", "by a connection"]


async def test_the_lag_metric_ages_while_no_node_answers(outbox_dsn):
    q = _q("lag")
    with psycopg.connect(outbox_dsn) as conn:
        add(conn, q, "stuck")
    metrics = RelayMetrics()
    relay = Relay(RelayOptions(dsn=outbox_dsn, urls=[f"http://127.0.0.1:{free_port()}"],
                               poll_ms=200, deadline_ms=300, settle_ms=60_000), metrics)
    stop = asyncio.Event()
    task = asyncio.create_task(relay.run(stop))
    try:
        deadline = time.monotonic() + 15
        while metrics.lag._value.get() < 1.5:
            assert time.monotonic() < deadline, metrics.lag._value.get()
            await asyncio.sleep(0.1)
        assert metrics.send_failures._value.get() >= 1
        assert pending(outbox_dsn) == 1  # kept, to be sent when a node answers
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        with psycopg.connect(outbox_dsn) as conn:
            conn.execute("DELETE FROM vqueues_outbox.records WHERE queue = %s", (q,))
            conn.execute("DELETE FROM vqueues_outbox.queues WHERE queue = %s", (q,))
