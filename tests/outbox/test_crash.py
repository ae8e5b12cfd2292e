"""The relay killed anywhere, two relays at once, a node killed: every committed row once, in
order per queue, rolled-back rows never. The nodes run with the idempotency window off
(`VQ_IDEMPOTENCY_WINDOW_MS=0`): the outage is longer than any window, so only what the relay
keeps in the database prevents a second copy (docs/outbox.md#what-it-promises)."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from vqueues_client.outbox import add, add_async

from tests.outbox.relays import RelayProcess, pending, queue_records, scalar, wait_until
from tests.support import NodeProcess, Topics, create_topics, http

NO_WINDOW = {"VQ_IDEMPOTENCY_WINDOW_MS": "0"}


@pytest.fixture(scope="module")
def node(topics: Topics) -> Iterator[NodeProcess]:
    n = NodeProcess(topics, extra_env=NO_WINDOW).start()
    try:
        yield n
    finally:
        n.terminate()


class Writer:
    """Transactions of 1-5 rows over `queues`, a sixth of them rolled back; remembers each
    committed row's id, which per queue is its commit order."""

    def __init__(self, dsn: str, queues: list[str]) -> None:
        self.dsn = dsn
        self.queues = queues
        self.committed: dict[str, list[tuple[int, str]]] = {q: [] for q in queues}
        self.rolled_back: set[str] = set()

    async def run(self, name: str, transactions: int, pause_s: float, seed: int) -> None:
        rnd = random.Random(seed)
        async with await psycopg.AsyncConnection.connect(self.dsn) as conn:
            for t in range(transactions):
                rows = []
                rollback = rnd.random() < 1 / 6
                try:
                    async with conn.transaction():
                        # Queues in one order in every transaction: no deadlock between
                        # the writers' queue locks (docs/outbox.md).
                        picked = sorted(rnd.choice(self.queues)
                                        for _ in range(rnd.randint(1, 5)))
                        for i, q in enumerate(picked):
                            value = f"{name}-{t}-{i}"
                            rows.append((q, await add_async(conn, q, value), value))
                        if rollback:
                            raise _RollBack
                except _RollBack:
                    self.rolled_back.update(v for _, _, v in rows)
                else:
                    for q, rid, value in rows:
                        self.committed[q].append((rid, value))
                await asyncio.sleep(pause_s)

    def expected(self, q: str) -> list[str]:
        return [v for _, v in sorted(self.committed[q])]


class _RollBack(Exception):
    pass


async def check_exactly_once(url: str, writer: Writer) -> None:
    for q in writer.queues:
        got = [r.text for r in await queue_records(url, q)]
        assert got == writer.expected(q), q
        assert not writer.rolled_back & set(got)


def _queues(n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"crash-{tag}-{i}" for i in range(n)]


async def test_a_relay_killed_after_the_enqueue_before_the_delete(outbox_dsn, node):
    """The records are stored, the relay dies before its delete commits: the next relay reads
    the queue back and sends nothing twice."""
    q = _queues(1)[0]
    with psycopg.connect(outbox_dsn) as conn:
        for i in range(5):
            add(conn, q, f"v{i}")
    with psycopg.connect(outbox_dsn) as holder:
        # Row locks: the relay reads and sends the rows, and its DELETE waits on them.
        holder.execute("SELECT id FROM vqueues_outbox.records WHERE queue = %s FOR UPDATE",
                       (q,))
        relay = RelayProcess(outbox_dsn, node.url).start()
        try:
            deadline = time.monotonic() + 20
            while len(await queue_records(node.url, q)) < 5:
                assert time.monotonic() < deadline, "the relay did not send"
                await asyncio.sleep(0.1)
        finally:
            relay.kill()
        holder.rollback()
    assert pending(outbox_dsn) == 5
    assert scalar(outbox_dsn, "SELECT sent_at IS NOT NULL FROM vqueues_outbox.queues "
                  "WHERE queue = %s", (q,))
    second = RelayProcess(outbox_dsn, node.url).start()
    try:
        wait_until(lambda: pending(outbox_dsn) == 0, 30, "the rows to be settled")
        await asyncio.sleep(0.3)
    finally:
        assert second.stop() == 0
    assert [r.text for r in await queue_records(node.url, q)] == [f"v{i}" for i in range(5)]
    assert any('"found": 5' in line for line in second.events("outbox_queue_read_back"))


@pytest.mark.slow
async def test_relays_killed_at_random_under_load(outbox_dsn, node):
    """Two relays race; they are SIGKILLed and restarted in turn at random moments (so the one
    holding the buckets dies each time, and the other takes over), while two writers commit
    and roll back."""
    queues = _queues(6)
    writer = Writer(outbox_dsn, queues)
    relays = [RelayProcess(outbox_dsn, node.url, ["--batch-records", "20"]).start()
              for _ in range(2)]
    writing = asyncio.gather(writer.run("a", 120, 0.03, 1), writer.run("b", 120, 0.03, 2))
    rnd = random.Random(7)
    kills = 0
    try:
        while not writing.done():
            await asyncio.sleep(rnd.uniform(0.3, 1.2))
            victim = relays[kills % 2]
            victim.kill()
            kills += 1
            victim.start()
        await writing
        deadline = time.monotonic() + 60
        while pending(outbox_dsn) > 0:
            assert time.monotonic() < deadline, "rows left in the outbox"
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)
    finally:
        for r in relays:
            r.kill()
    assert kills >= 3
    assert sum(len(v) for v in writer.committed.values()) > 100
    await check_exactly_once(node.url, writer)


@pytest.mark.slow
async def test_a_node_killed_while_the_relay_sends(outbox_dsn, topics):
    node = NodeProcess(topics, extra_env=NO_WINDOW).start()
    queues = _queues(4)
    writer = Writer(outbox_dsn, queues)
    relay = RelayProcess(outbox_dsn, node.url, ["--batch-records", "20"]).start()
    try:
        writing = asyncio.ensure_future(writer.run("w", 80, 0.02, 3))
        await asyncio.sleep(1.0)
        node.kill()
        await asyncio.sleep(0.5)
        node.start()  # the same port: the relay's URL
        await writing
        deadline = time.monotonic() + 60
        while pending(outbox_dsn) > 0:
            assert time.monotonic() < deadline, "rows left in the outbox"
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)
        await check_exactly_once(node.url, writer)
    finally:
        relay.kill()
        node.terminate()


async def test_the_relays_database_connection_cut_under_load(outbox_dsn, node):
    """The relay's session is terminated again and again (its bucket locks go with it) while
    it sends: it reconnects, reads back what it had in flight, and sends nothing twice."""
    queues = _queues(4)
    writer = Writer(outbox_dsn, queues)
    relay = RelayProcess(outbox_dsn, node.url, ["--batch-records", "20"]).start()
    cuts = rounds = 0
    try:
        # Rounds of writing go on until the relay's session was cut at least twice while
        # rows were being written: on a slow machine the relay's start and its reconnection
        # backoff could take most of one round.
        writing = asyncio.ensure_future(writer.run("c0", 100, 0.02, 4))
        while True:
            await asyncio.sleep(0.4)
            cuts += scalar(outbox_dsn, "SELECT count(pg_terminate_backend(pid)) FROM "
                           "pg_stat_activity WHERE application_name = 'vqueues-outbox-relay'")
            if writing.done():
                await writing
                rounds += 1
                if cuts >= 2 or rounds >= 8:
                    break
                writing = asyncio.ensure_future(writer.run(f"c{rounds}", 100, 0.02, 4 + rounds))
        deadline = time.monotonic() + 60
        while pending(outbox_dsn) > 0:
            assert time.monotonic() < deadline, "rows left in the outbox"
            await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)
    finally:
        relay.kill()
    assert cuts >= 2
    assert relay.events("outbox_db_error")
    await check_exactly_once(node.url, writer)


async def test_a_quota_refusing_the_relay(outbox_dsn, topics, tmp_path):
    """The node answers 429 quota_exceeded (nothing written): the relay backs off and sends
    again until every row is stored, once and in order."""
    # A bucket of 2 under batches of 20: each batch is admitted only into a full bucket and
    # leaves 10 s of debt, so the next one is refused unless the relay stalls that long.
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"quotas": [
        {"prefix": "quota-", "records_per_s": 2, "burst_s": 1}]}))
    # Topics of its own: on the module's topics the module's node, which has no quota file,
    # owns some partitions, and the relay sends each queue to its owner (1 run in 2 of the
    # whole module found no 429).
    own = create_topics(topics.bootstrap, partitions=4)
    node = NodeProcess(own, extra_env={**NO_WINDOW, "VQ_QUOTA_FILE": str(quotas)}).start()
    q = f"quota-{uuid.uuid4().hex[:6]}"
    with psycopg.connect(outbox_dsn) as conn:
        for i in range(40):
            add(conn, q, f"v{i}")
    relay = RelayProcess(outbox_dsn, node.url, ["--batch-records", "20"]).start()
    try:
        wait_until(lambda: pending(outbox_dsn) == 0, 60, "the rows to be relayed")
        await asyncio.sleep(0.3)
        assert [r.text for r in await queue_records(node.url, q)] == [f"v{i}" for i in range(40)]
        _, metrics = http("GET", f"{node.url}/metrics?name[]=vq_quota_refusals_total")
        text = metrics.decode() if isinstance(metrics, bytes) else str(metrics)
        refusals = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith('vq_quota_refusals_total{prefix="quota-"}')]
        assert refusals and refusals[0] > 0  # the node did answer 429s
    finally:
        relay.kill()
        node.terminate()
