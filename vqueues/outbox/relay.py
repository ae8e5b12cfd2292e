"""The relay: moves committed outbox rows to their queues, each queue's rows in commit order,
each row once (docs/outbox.md, docs/adr/0018-transactional-outbox.md).

One database connection holds everything that must end with the relay: the session locks of
the buckets it relays (a relay that dies releases them with its session), LISTEN, and the
transactions that delete relayed rows. Before it sends a batch it stamps its queues' `sent_at`;
the transaction that deletes the rows sent clears it and stores each queue's offset after its
last record. A relay that finds `sent_at` set (its own send failed, or it took a bucket over
from a relay that died) reads the queue from that offset to its end and deletes the rows it
finds there (the header `vq-outbox-id`, or a row's own idempotency key) before sending the
others again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from vqueues_client import AsyncClient, NewRecord, RecordResult, VQError

from vqueues.outbox.schema import BUCKET_LOCK_CLASS, BUCKETS, NOTIFY_CHANNEL, SCHEMA

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("vqueues.outbox")

OUTBOX_ID_HEADER = "vq-outbox-id"
APPLICATION_NAME = "vqueues-outbox-relay"  # its connection in pg_stat_activity
ORDERING_KEY_HEADER = "vq-ordering-key"
# Codes that say the relay (its token) may not write, not that the record is bad: the rows
# wait until that is fixed instead of going to the dead rows.
_HOLD_CODES = frozenset({"unauthenticated", "forbidden", "deadline_exceeded"})
_NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"


@dataclass
class RelayOptions:
    """What `vqueues outbox relay` takes (docs/outbox.md#running-the-relay)."""

    dsn: str
    urls: list[str]
    token: str | None = None
    batch_records: int = 1000
    poll_ms: int = 1000
    # Each send (with the client's retries) ends within deadline_ms; a record it carried is
    # written, if ever, within settle_ms of the send's start (the deadline plus the node's
    # broker_timeout_ms and write_visible_timeout_ms, with room).
    deadline_ms: int = 10_000
    settle_ms: int = 25_000
    backoff_max_ms: int = 10_000


class RelayMetrics:
    """The relay's Prometheus metrics, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.relayed = Counter("vq_outbox_rows_relayed_total",
                               "rows whose records the node stored", registry=r)
        self.dead = Counter("vq_outbox_rows_dead_total",
                            "rows the node refused for good, moved to the dead rows", registry=r)
        self.send_failures = Counter("vq_outbox_send_failures_total",
                                     "sends that did not settle every row", registry=r)
        self.read_backs = Counter("vq_outbox_read_backs_total",
                                  "queues read back before their rows were sent again",
                                  registry=r)
        self.found = Counter("vq_outbox_rows_found_stored_total",
                             "rows a read-back found already in their queue", registry=r)
        self.unverified = Counter("vq_outbox_unverified_read_backs_total",
                                  "read-backs that could not see every record since the "
                                  "stored offset (retention or deletion removed some)",
                                  registry=r)
        self.db_errors = Counter("vq_outbox_db_errors_total",
                                 "database errors (the relay reconnects)", registry=r)
        self.lag = Gauge("vq_outbox_lag_seconds",
                         "age of the oldest due row not yet relayed (since it was inserted or "
                         "became due); 0 when none", registry=r)
        self.buckets = Gauge("vq_outbox_buckets_held", "buckets this relay holds", registry=r)


@dataclass(slots=True)
class _Row:
    id: int
    queue: str
    value: bytes | None
    headers: dict[str, str]
    ordering_key: str | None
    tags: list[str] | None
    key: str | None


@dataclass
class _State:
    """What the relay knows while its connection lives (dropped with it)."""

    namespace: str = ""
    held: set[int] = field(default_factory=set)
    # Queues with a send not known to have settled: monotonic time from which to read back.
    in_doubt: dict[str, float] = field(default_factory=dict)
    next_claim: float = 0.0
    next_lag: float = 0.0


class Relay:
    """`await Relay(options).run(stop)` relays until `stop` is set."""

    def __init__(self, options: RelayOptions, metrics: RelayMetrics | None = None) -> None:
        self.options = options
        self.metrics = metrics or RelayMetrics()
        self.state = _State()
        self._failures = 0
        self._stop = asyncio.Event()

    async def run(self, stop: asyncio.Event) -> None:
        import psycopg

        o = self.options
        self._stop = stop
        deadline_s = o.deadline_ms / 1000
        async with AsyncClient(o.urls, token=o.token, deadline_s=deadline_s,
                               request_timeout_s=deadline_s) as vq:
            delay = 0.1
            while not stop.is_set():
                try:
                    await self._connected(vq, stop)
                    delay = 0.1
                except (psycopg.Error, OSError) as exc:
                    self.metrics.db_errors.inc()
                    log.warning("outbox_db_error", extra={"error": str(exc)[:300]})
                    await _sleep(stop, delay)
                    delay = min(o.backoff_max_ms / 1000, delay * 2)
                finally:
                    self.state = _State()
                    self.metrics.buckets.set(0)

    async def _connected(self, vq: AsyncClient, stop: asyncio.Event) -> None:
        import psycopg

        async with await psycopg.AsyncConnection.connect(
                self.options.dsn, autocommit=True,
                application_name=APPLICATION_NAME) as conn:
            row = await (await conn.execute(f"SELECT namespace FROM {SCHEMA}.meta")).fetchone()
            assert row is not None, "vqueues outbox install has not run on this database"
            self.state.namespace = str(row[0])
            await conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
            log.info("outbox_relay_connected", extra={"namespace": self.state.namespace})
            while not stop.is_set():
                if not await self._cycle(conn, vq):
                    await self._wait(conn, stop)

    # One pass ----------------------------------------------------------------------------------

    async def _cycle(self, conn: psycopg.AsyncConnection[Any], vq: AsyncClient) -> bool:
        """Claim free buckets, read back queues in doubt, send one batch. True if it sent."""
        s = self.state
        now = time.monotonic()
        if now >= s.next_claim:
            s.next_claim = now + self.options.poll_ms / 1000
            await self._claim(conn)
        if now >= s.next_lag:
            s.next_lag = now + 1.0
            await self._measure_lag(conn)
        if not s.held:
            return False
        for queue in [q for q, at in s.in_doubt.items() if at <= now]:
            await self._read_back(conn, vq, queue)
        cur = await conn.execute(
            f"SELECT id, queue, value, headers, ordering_key, tags, idempotency_key "
            f"FROM {SCHEMA}.records WHERE bucket = ANY(%s::smallint[]) "
            f"AND (deliver_at IS NULL OR deliver_at <= {_NOW_MS}) "
            f"AND NOT (queue = ANY(%s::text[])) ORDER BY id LIMIT %s",
            (sorted(s.held), list(s.in_doubt), min(self.options.batch_records,
                                                    vq.max_records_per_call)))
        rows = [_Row(r[0], r[1], None if r[2] is None else bytes(r[2]), r[3], r[4], r[5], r[6])
                for r in await cur.fetchall()]
        if not rows:
            return False
        await self._send(conn, vq, rows)
        return True

    async def _claim(self, conn: psycopg.AsyncConnection[Any]) -> None:
        """Take the session lock of every bucket no relay holds; note their queues in doubt."""
        s = self.state
        cur = await conn.execute(
            "SELECT b FROM generate_series(0, %s) AS b WHERE CASE WHEN b = ANY(%s::int[]) "
            "THEN false ELSE pg_try_advisory_lock(%s, b) END",
            (BUCKETS - 1, sorted(s.held), BUCKET_LOCK_CLASS))
        new = [int(r[0]) for r in await cur.fetchall()]
        if not new:
            return
        s.held.update(new)
        self.metrics.buckets.set(len(s.held))
        log.info("outbox_buckets_claimed", extra={"buckets": new, "held": len(s.held)})
        cur = await conn.execute(
            f"SELECT queue, GREATEST(0, extract(epoch FROM sent_at - clock_timestamp()) "
            f"+ %s)::float8 FROM {SCHEMA}.queues WHERE sent_at IS NOT NULL "
            f"AND {SCHEMA}.bucket_of(queue) = ANY(%s::smallint[])",
            (self.options.settle_ms / 1000, new))
        now = time.monotonic()
        for queue, wait_s in await cur.fetchall():
            s.in_doubt[queue] = now + float(wait_s)

    async def _measure_lag(self, conn: psycopg.AsyncConnection[Any]) -> None:
        cur = await conn.execute(
            f"SELECT GREATEST(0, {_NOW_MS} - GREATEST((extract(epoch FROM created_at) * 1000)"
            f"::bigint, coalesce(deliver_at, 0))) FROM {SCHEMA}.records "
            f"WHERE deliver_at IS NULL OR deliver_at <= {_NOW_MS} ORDER BY id LIMIT 1")
        row = await cur.fetchone()
        self.metrics.lag.set(0 if row is None else int(row[0]) / 1000)

    async def _wait(self, conn: psycopg.AsyncConnection[Any], stop: asyncio.Event) -> None:
        """Until a notification, the next due row or queue in doubt, the poll interval, or
        `stop` (the connection is closed then, so the wait on it may be cut anywhere)."""
        s = self.state
        timeout = self.options.poll_ms / 1000
        if s.held:
            cur = await conn.execute(
                f"SELECT min(deliver_at) - {_NOW_MS} FROM {SCHEMA}.records "
                f"WHERE bucket = ANY(%s::smallint[]) AND deliver_at > {_NOW_MS}",
                (sorted(s.held),))
            row = await cur.fetchone()
            if row is not None and row[0] is not None:
                timeout = min(timeout, int(row[0]) / 1000)
        if s.in_doubt:
            timeout = min(timeout, min(s.in_doubt.values()) - time.monotonic())
        notified = asyncio.ensure_future(_notified(conn, max(0.0, timeout)))
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait((notified, stopped), return_when=asyncio.FIRST_COMPLETED)
        for task in (notified, stopped):
            task.cancel()
        await asyncio.gather(notified, stopped, return_exceptions=True)

    # Sending -------------------------------------------------------------------------------------

    def _record(self, row: _Row) -> NewRecord:
        headers = dict(row.headers)
        if row.ordering_key is not None:
            headers[ORDERING_KEY_HEADER] = row.ordering_key
        key = row.key
        if key is None:  # a row of its own: named by the header, keyed by the same name
            headers[OUTBOX_ID_HEADER] = f"{self.state.namespace}:{row.id}"
            key = f"vq-outbox:{self.state.namespace}:{row.id}"
        value: bytes | str | None = row.value
        if row.value is not None:
            with contextlib.suppress(UnicodeDecodeError):
                value = row.value.decode("utf-8")  # sent as text: no base64 (a third more)
        return NewRecord(value, headers, key, row.tags)

    async def _send(self, conn: psycopg.AsyncConnection[Any], vq: AsyncClient,
                    rows: list[_Row]) -> None:
        o = self.options
        queues = list(dict.fromkeys(r.queue for r in rows))
        await conn.execute(
            f"INSERT INTO {SCHEMA}.queues (queue, sent_at) SELECT unnest(%s::text[]), "
            f"clock_timestamp() ON CONFLICT (queue) DO UPDATE SET sent_at = EXCLUDED.sent_at",
            (queues,))
        try:
            results = await asyncio.wait_for(
                vq.enqueue_many([(r.queue, self._record(r)) for r in rows],
                                deadline_s=o.deadline_ms / 1000), 2 * o.deadline_ms / 1000)
        except Exception as exc:  # VQError, a timeout, anything: the rows' fate is unknown
            log.warning("outbox_send_failed", extra={"rows": len(rows), "error": repr(exc)})
            await self._failed(queues)
            return
        await self._settle(conn, rows, results)

    async def _failed(self, queues: list[str]) -> None:
        self.metrics.send_failures.inc()
        at = time.monotonic() + self.options.settle_ms / 1000
        for q in queues:
            self.state.in_doubt[q] = at
        self._failures += 1
        await _sleep(self._stop, min(self.options.backoff_max_ms / 1000,
                                     0.1 * 2 ** min(self._failures, 10)))

    async def _settle(self, conn: psycopg.AsyncConnection[Any], rows: list[_Row],
                      results: list[RecordResult]) -> None:
        """Delete the rows stored and move those refused for good to the dead rows, in one
        transaction that stores each queue's next offset and clears `sent_at` of the queues
        whose every row settled."""
        done: list[int] = []
        dead_ids: list[int] = []
        dead_errors: list[str] = []
        next_offset: dict[str, int | None] = {}
        doubt: set[str] = set()
        for i, (row, res) in enumerate(zip(rows, results, strict=True)):
            next_offset.setdefault(row.queue, None)
            err = res.error
            if err is None:
                done.append(row.id)
                if res.offset is not None:
                    next_offset[row.queue] = max(res.offset + 1, next_offset[row.queue] or 0)
            elif 400 <= err.status < 500 and not err.retriable and err.code not in _HOLD_CODES:
                at = err.details.get("index")
                if type(at) is int and at != i and 0 <= at < len(rows) and (
                        rows[at].queue == row.queue):
                    continue  # refused with its queue for another row: not stored, sent again
                dead_ids.append(row.id)
                dead_errors.append(json.dumps({
                    "status": err.status, "code": err.code, "message": err.message,
                    "retriable": err.retriable}))
            else:
                doubt.add(row.queue)
        qs = list(next_offset)
        async with conn.transaction():
            if done:
                await conn.execute(f"DELETE FROM {SCHEMA}.records WHERE id = ANY(%s::bigint[])",
                                   (done,))
            if dead_ids:
                await conn.execute(
                    f"WITH moved AS (DELETE FROM {SCHEMA}.records r USING "
                    f"unnest(%s::bigint[], %s::jsonb[]) AS d(id, error) WHERE r.id = d.id "
                    f"RETURNING r.*, d.error) INSERT INTO {SCHEMA}.dead (id, queue, value, "
                    f"headers, ordering_key, tags, idempotency_key, deliver_at, created_at, "
                    f"error) SELECT id, queue, value, headers, ordering_key, tags, "
                    f"idempotency_key, deliver_at, created_at, error FROM moved",
                    (dead_ids, dead_errors))
            await conn.execute(
                f"UPDATE {SCHEMA}.queues q SET next_offset = GREATEST(q.next_offset, v.next), "
                f"sent_at = CASE WHEN v.settled THEN NULL ELSE q.sent_at END FROM "
                f"unnest(%s::text[], %s::bigint[], %s::bool[]) AS v(queue, next, settled) "
                f"WHERE q.queue = v.queue",
                (qs, [next_offset[q] for q in qs], [q not in doubt for q in qs]))
        self.metrics.relayed.inc(len(done))
        self.metrics.dead.inc(len(dead_ids))
        if dead_ids:
            log.warning("outbox_rows_dead", extra={"ids": dead_ids[:20], "count": len(dead_ids)})
        if doubt:
            log.warning("outbox_rows_unsettled", extra={"queues": sorted(doubt)[:20]})
            await self._failed(sorted(doubt))
        else:
            self._failures = 0

    # Reading back --------------------------------------------------------------------------------

    async def _read_back(self, conn: psycopg.AsyncConnection[Any], vq: AsyncClient,
                       queue: str) -> None:
        """Read `queue` from its stored offset to its end; delete the rows found there (each
        stored once already) and clear its `sent_at`, so its other rows are sent again."""
        s = self.state
        cur = await conn.execute(f"SELECT next_offset FROM {SCHEMA}.queues WHERE queue = %s",
                                 (queue,))
        row = await cur.fetchone()
        stored = None if row is None else row[0]
        cur = await conn.execute(
            f"SELECT id, idempotency_key FROM {SCHEMA}.records WHERE queue = %s "
            f"AND idempotency_key IS NOT NULL", (queue,))
        keyed: dict[str, list[int]] = {}
        for rid, key in await cur.fetchall():
            keyed.setdefault(key, []).append(int(rid))
        try:
            found, end = await self._scan(vq, queue, stored, keyed)
        except VQError as exc:
            log.warning("outbox_read_back_failed", extra={"queue": queue, "error": str(exc)})
            s.in_doubt[queue] = time.monotonic() + min(self.options.backoff_max_ms / 1000, 1.0)
            return
        async with conn.transaction():
            await conn.execute(
                f"DELETE FROM {SCHEMA}.records WHERE queue = %s AND id = ANY(%s::bigint[])",
                (queue, sorted(found)))
            await conn.execute(
                f"UPDATE {SCHEMA}.queues SET next_offset = GREATEST(next_offset, %s), "
                f"sent_at = NULL WHERE queue = %s", (end, queue))
        del s.in_doubt[queue]
        self.metrics.read_backs.inc()
        self.metrics.found.inc(len(found))
        log.info("outbox_queue_read_back", extra={"queue": queue, "from_offset": stored,
                                                  "found": len(found)})

    async def _scan(self, vq: AsyncClient, queue: str, stored: int | None,
                    keyed: dict[str, list[int]]) -> tuple[set[int], int | None]:
        """The ids of this database's rows stored in `queue` at or after `stored`, and the
        offset after the last of them (None if none)."""
        info = await vq.queue_info(queue)
        if info is None:
            return set(), None
        first = info.get("first_offset")
        if stored is not None and (first is None or first >= stored):
            # The last record confirmed (at stored - 1) is gone: retention or a deletion may
            # have taken records this relay wrote since; those cannot be found.
            self.metrics.unverified.inc()
            log.warning("outbox_read_back_unverified", extra={"queue": queue, "stored": stored,
                                                            "first_offset": first})
        prefix = f"{self.state.namespace}:"
        found: set[int] = set()
        end: int | None = None
        offset = stored or 0
        while True:
            try:
                page = await vq.read(queue, offset=offset, limit=1000)
            except VQError as exc:
                if exc.code == "queue_not_found":
                    break
                raise
            if not page.records:
                break
            for rec in page.records:
                origin = rec.headers.get(OUTBOX_ID_HEADER, "")
                ids: list[int] = []
                if origin.startswith(prefix) and origin[len(prefix):].isdigit():
                    ids = [int(origin[len(prefix):])]
                elif (key := rec.headers.get("vq-idempotency-key")) in keyed:
                    ids = keyed[key]
                if ids:
                    found.update(ids)
                    end = rec.offset + 1
            offset = page.next_offset
        return found, end


async def _notified(conn: psycopg.AsyncConnection[Any], timeout_s: float) -> None:
    async for _ in conn.notifies(timeout=timeout_s, stop_after=1):
        break


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    """Sleep, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
