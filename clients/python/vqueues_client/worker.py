"""`Worker`: a pool of handlers on a lease consumer (docs/work-queues.md).

`concurrency` handler slots take leased records from a buffer; a leaser per queue keeps the
buffer filled ahead of them (at most `concurrency + prefetch` records leased and not yet
handled, in calls of at least a quarter of that room, up to `max_batch`), long-polling a queue
that has nothing with one slot reserved, so an idle queue holds no room another could use.
Without an explicit `prefetch` the room follows the handlers: 10 records per slot (at least
64), growing up to 64 per slot while the slots would handle more than that within two lease
round trips (both times measured as it runs). A handler that returns has its record's token
sent with its source's next lease (`complete=`: one call per cycle, not a lease and a
complete); tokens no lease took within `complete_delay_ms` are completed in one standalone
call. A token the node refuses (its lease expired, say) goes to `on_refused(lease, code)`, or
else to a warning log line `complete_refused`. A handler that raises has its record retried
after a backoff that grows with its attempt number, with the exception as the reason (past the
consumer's `max_attempts` the server moves it to the dead-letter queue). A lease close to its
deadline (a slow handler, or a record waiting in the buffer) is extended, in one call per
queue; others never are. `stop()` stops leasing, gives the records still in the buffer back and
lets running handlers finish, or, with `finish=False`, cancels them and gives their records
back at once; then completes what is finished.

`Worker(vq, None, "pool", handle, prefix=True)` leases from the prefix consumer "pool" (one
pool for every queue under its prefix, docs/work-queues.md): a leaser per node of the cluster
map (each node leases from the queues it owns, in turn), settling with that node (a finished
record's token rides only on leases to the node that leased it); the map is refreshed every
`map_refresh_s` and on a node's `wrong_node`, leasers following it. A completion a node refuses
as `wrong_node` (or cannot take: gone) is sent once on its own to the queue's owner in the
refreshed map, and reported only if that fails too.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

from vqueues_client.client import AsyncClient
from vqueues_client.errors import VQError
from vqueues_client.types import Lease, LeasePage, Refused

log = logging.getLogger(__name__)

Handler = Callable[[Lease], Awaitable[Any]] | Callable[[Lease], Any]
# Called with a finished record whose completion the node refused, and the refusal's code.
RefusedHook = Callable[[Lease, str], Any]
# The most tokens one lease carries (the node's limit).
MAX_RIDING = 10_000


class _Source:
    """Where records come from and go back to: a queue, or one node of a prefix consumer."""

    def __init__(self, client: AsyncClient, consumer: str, queue: str | None = None,
                 node: str | None = None) -> None:
        self.client = client
        self.consumer = consumer
        self.queue = queue
        self.node = node
        self.name = queue if queue is not None else f"{consumer}@{node}"

    def id_of(self, lease: Lease) -> tuple[str, str]:
        """A lease's name in this worker: tokens are unique per queue, not across queues."""
        return (lease.queue or self.queue or ""), lease.token

    def stale(self, exc: VQError) -> set[tuple[str, str]]:
        """The leases a `lease_expired` refusal names."""
        if exc.code != "lease_expired":
            return set()
        out = set()
        for item in exc.details.get("stale", []):
            if isinstance(item, dict):
                out.add((str(item.get("queue")), str(item.get("token"))))
            else:
                out.add((self.queue or "", str(item)))
        return out

    async def lease(self, n: int, visibility_ms: int, wait_ms: int, complete: list[Lease]
                    ) -> tuple[list[Lease], list[Refused]]:
        """Records leased, and the refused of `complete` (sent only when it holds any)."""
        page: LeasePage[Any]
        if self.queue is not None:
            page = await self.client.lease(self.queue, self.consumer, max_records=n,
                                           visibility_ms=visibility_ms, wait_ms=wait_ms,
                                           complete=complete or None)
        else:
            assert self.node is not None
            page = await self.client.lease_prefix(self.consumer, self.node, max_records=n,
                                                  visibility_ms=visibility_ms, wait_ms=wait_ms,
                                                  complete=complete or None)
        return list(page), page.refused if complete else []

    def refused_id(self, refused: Refused) -> tuple[str, str]:
        return (refused.queue or self.queue or ""), refused.token

    async def complete(self, leases: list[Lease]) -> None:
        if self.queue is not None:
            await self.client.complete(self.queue, self.consumer, leases)
        else:
            assert self.node is not None
            await self.client.complete_prefix(self.consumer, self.node, leases)

    async def retry(self, leases: list[Lease], delay_ms: int = 0,
                    reason: str | None = None) -> None:
        if self.queue is not None:
            await self.client.retry(self.queue, self.consumer, leases, delay_ms=delay_ms,
                                    reason=reason)
        else:
            assert self.node is not None
            await self.client.retry_prefix(self.consumer, self.node, leases, delay_ms=delay_ms,
                                           reason=reason)

    async def extend(self, leases: list[Lease], visibility_ms: int
                     ) -> dict[tuple[str, str], int]:
        """The new deadline of each lease extended, by its id."""
        if self.queue is not None:
            out = await self.client.extend(self.queue, self.consumer, leases, visibility_ms)
            return {self.id_of(x): int(out.get("deadline") or 0) for x in leases}
        assert self.node is not None
        out = await self.client.extend_prefix(self.consumer, self.node, leases, visibility_ms)
        by_queue = {r["queue"]: int(r.get("deadline") or 0) for r in out.get("queues", [])}
        return {self.id_of(x): by_queue.get(x.queue or "", 0) for x in leases}


_Item = tuple[_Source, Lease]


class Worker:
    """`await Worker(vq, "jobs", "workers", handle, concurrency=8).run()` until `stop()`."""

    def __init__(self, client: AsyncClient, queues: str | list[str] | None, consumer: str,
                 handler: Handler, *, concurrency: int = 8, visibility_ms: int = 30_000,
                 wait_ms: int = 1000, idle_sleep_s: float = 0.05,
                 backoff_initial_ms: int = 1000, backoff_max_ms: int = 60_000,
                 prefetch: int | None = None, max_batch: int = 250,
                 complete_delay_ms: float = 50.0, prefix: bool = False,
                 map_refresh_s: float = 5.0, on_refused: RefusedHook | None = None) -> None:
        self.client = client
        self.prefix = prefix
        self.queues = [] if queues is None else [queues] if isinstance(queues, str) \
            else list(queues)
        if prefix and self.queues:
            raise ValueError("a prefix Worker leases from the prefix consumer: give no queues")
        if not prefix and not self.queues:
            raise ValueError("a Worker needs at least one queue (or prefix=True)")
        self.map_refresh_s = map_refresh_s
        if concurrency < 1 or max_batch < 1:
            raise ValueError("concurrency and max_batch must be at least 1")
        self.consumer = consumer
        self.handler = handler
        self.concurrency = concurrency
        self.visibility_ms = visibility_ms
        self.wait_ms = wait_ms
        self.idle_sleep_s = idle_sleep_s  # the pause after a failed lease call
        self.backoff_initial_ms = backoff_initial_ms
        self.backoff_max_ms = backoff_max_ms
        # Leased ahead: at least 10 per slot, as many as a worker per slot leasing 10 at a time
        # holds. Fast handlers empty that in less than a lease round trip, and the slots then
        # wait. So the room grows to what the slots handle in two round trips, up to 64 per
        # slot (`_adapt`; ADR 15 has the figures that set it and `max_batch`); an explicit
        # `prefetch` is kept as given.
        self._adaptive = prefetch is None
        self._floor = max(10 * concurrency, 64) if prefetch is None else max(0, prefetch)
        self._ceiling = max(64 * concurrency, self._floor) if prefetch is None else self._floor
        self.capacity = concurrency + self._floor  # records leased and not yet handled, at most
        self._handler_s = 0.0  # moving averages: a handler's run, a lease call's round trip
        self._lease_s = 0.0
        self.max_batch = max_batch
        # The longest a finished record's token waits for a lease to ride on.
        self.complete_delay_s = complete_delay_ms / 1000
        self.on_refused = on_refused
        self.completed = 0
        self.failed = 0
        self.refused = 0  # finished records whose completion the node refused
        self._stopping = asyncio.Event()
        self._finish = True
        self._buffer: asyncio.Queue[_Item] = asyncio.Queue()
        self._held = 0  # records leased and not yet settled, plus slots reserved for a lease
        self._room = asyncio.Event()  # set when `_held` falls
        # Unsettled leases by id ((queue, token)), and their deadlines (UTC ms, extended too).
        self._leases: dict[tuple[str, str], tuple[_Source, Lease]] = {}
        self._deadlines: dict[tuple[str, str], int] = {}
        self._done: dict[_Source, list[Lease]] = {}  # handled, to complete
        self._flushers: dict[_Source, asyncio.Task[None]] = {}  # waiting complete_delay_ms
        self._no_riding: set[_Source] = set()  # nodes whose leases take no completions
        self._flushing: set[asyncio.Task[None]] = set()  # past the wait, completing
        self._leasers: dict[str, asyncio.Task[None]] = {}  # by source name
        self._map_stale = asyncio.Event()  # a prefix leaser found its node gone
        self._running: set[asyncio.Task[Any]] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._started = False
        self._abandoning = False  # stop(finish=False): cancelled handlers give records back
        self._stopped = asyncio.Event()
        self._is_async = inspect.iscoroutinefunction(handler)

    async def run(self) -> None:
        """Lease and handle until `stop()` (then return once everything is settled)."""
        for q in self.queues:
            self._start_leaser(_Source(self.client, self.consumer, queue=q))
        slots = [asyncio.create_task(self._slot()) for _ in range(self.concurrency)]
        keeper = asyncio.create_task(self._keeper())
        self._tasks = [*slots, keeper]
        if self.prefix:
            self._tasks.append(asyncio.create_task(self._follow_map()))
        self._started = True
        try:
            await self._stopping.wait()
            # Each leaser ends after its call in progress (at most `wait_ms`): a call cut off
            # could lose records the server had just granted (until their deadline).
            await asyncio.gather(*self._leasers.values(), return_exceptions=True)
            await self._give_back_buffered()
            if not self._finish:
                self._abandoning = True
                for t in list(self._running):  # the slots running a handler
                    t.cancel()
            await self._buffer.join()  # every handler taken has finished
            for t in slots:
                t.cancel()
            await self._flush_all()
        finally:
            for t in [*self._tasks, *self._leasers.values()]:
                t.cancel()
            await asyncio.gather(*self._tasks, *self._leasers.values(), return_exceptions=True)
            self._stopped.set()

    def _start_leaser(self, source: _Source) -> None:
        self._leasers[source.name] = asyncio.create_task(self._leaser(source))

    async def _follow_map(self) -> None:
        """A prefix worker's leasers: one per node of the cluster map, as it changes."""
        while not self._stopping.is_set():
            try:
                nodes = await self.client.node_urls()
            except VQError as exc:
                log.warning("map_refresh_failed", extra={"error": str(exc)})
                nodes = []
            for url in nodes:
                name = f"{self.consumer}@{url}"
                if name not in self._leasers or self._leasers[name].done():
                    self._start_leaser(_Source(self.client, self.consumer, node=url))
            self._map_stale.clear()
            waits = [asyncio.ensure_future(e.wait()) for e in (self._stopping, self._map_stale)]
            try:
                await asyncio.wait(waits, timeout=self.map_refresh_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    async def stop(self, finish: bool = True) -> None:
        """Stop leasing and return once `run` has returned. `finish`: running handlers complete
        their records; otherwise they are cancelled and their records given back (retry with
        no delay). Records leased ahead and not started are given back either way."""
        self._finish = finish
        self._stopping.set()
        self._room.set()  # a leaser waiting for room ends
        if self._started:
            await self._stopped.wait()

    def backoff_ms(self, attempt: int) -> int:
        """Delay before a failed record comes again: exponential in its attempt, jittered."""
        base = min(self.backoff_max_ms, self.backoff_initial_ms * 2 ** max(0, attempt - 1))
        return int(base * random.uniform(0.5, 1.0))

    # Leasing ahead ---------------------------------------------------------------------------

    async def _reserve(self, most: int, least: int = 1) -> int:
        """Reserve up to `most` records' room, waiting until there is `least` (0 once
        stopping)."""
        while self.capacity - self._held < least:
            if self._stopping.is_set():
                return 0
            self._room.clear()
            await self._room.wait()
        n = min(most, self.capacity - self._held)
        self._held += n
        return n

    def _release(self, n: int) -> None:
        self._held -= n
        self._room.set()

    def _adapt(self) -> None:
        """Lease ahead what the slots handle in two lease round trips, between the floor and
        the ceiling (only without an explicit `prefetch`)."""
        if not self._adaptive or self._handler_s <= 0:
            return
        wanted = int(2 * self.concurrency * self._lease_s / self._handler_s)
        capacity = self.concurrency + min(self._ceiling, max(self._floor, wanted))
        if capacity > self.capacity:
            self._room.set()  # a leaser waiting for room may go on
        self.capacity = capacity

    async def _leaser(self, source: _Source) -> None:
        idle = False  # the last lease found nothing: long-poll with one slot reserved
        while not self._stopping.is_set():
            # A queue with records leases in calls of at least a quarter of the room (or
            # `max_batch`): a few large calls cost the node far less per record than many
            # small ones, and up to four in flight hide each other's round trip.
            n = await (self._reserve(1) if idle else self._reserve(
                self.max_batch, min(self.max_batch, max(1, self.capacity // 4))))
            if not n:
                return
            riding = self._take(source)
            started = time.perf_counter()
            try:
                got, refused = await source.lease(n, self.visibility_ms,
                                                  self.wait_ms if idle else 0, riding)
            except VQError as exc:
                self._release(n)
                self._put_back(source, riding)  # sent again: completing is idempotent
                if riding and exc.code == "invalid_parameter" and \
                        "complete" in (exc.details.get("unknown") or ()):
                    # A node from before completions rode on leases (a rolling upgrade):
                    # complete alone there, as Workers did then.
                    self._no_riding.add(source)
                    log.info("lease_without_completions", extra={"source": source.name})
                    continue
                log.warning("lease_failed", extra={"source": source.name, "error": str(exc)})
                if source.node is not None and exc.code in ("wrong_node", "connection_error",
                                                            "deadline_exceeded"):
                    self._map_stale.set()  # the map says who holds those queues now
                    return
                await asyncio.sleep(self.idle_sleep_s)
                continue
            except BaseException:
                self._release(n)
                self._put_back(source, riding, arm=False)  # (torn down: stop() flushes them)
                raise
            self._release(n - len(got))
            if not idle and got:  # a long poll's time is the wait, not the round trip
                self._lease_s = _average(self._lease_s, time.perf_counter() - started)
                self._adapt()
            idle = not got
            for lease in got:
                lease_id = source.id_of(lease)
                self._leases[lease_id] = (source, lease)
                self._deadlines[lease_id] = lease.deadline
                self._buffer.put_nowait((source, lease))
            if riding:
                await self._rode(source, riding, refused)

    async def _give_back_buffered(self) -> None:
        """Records leased ahead that no handler took: back to the queue at once."""
        by_source: dict[_Source, list[Lease]] = {}
        while not self._buffer.empty():
            source, lease = self._buffer.get_nowait()
            by_source.setdefault(source, []).append(lease)
            self._buffer.task_done()
        for source, leases in by_source.items():
            with contextlib.suppress(VQError):
                await source.retry(leases, reason="worker stopped")
            self._settled(source, leases)

    # Handling --------------------------------------------------------------------------------

    async def _slot(self) -> None:
        while True:
            source, lease = await self._buffer.get()
            try:
                await self._handle(source, lease)
            finally:
                self._buffer.task_done()

    async def _handle(self, source: _Source, lease: Lease) -> None:
        # The handler runs in the slot's own task (a task per record cost the client more
        # than the rest of its work on the record); stop(finish=False) cancels busy slots.
        me = asyncio.current_task()
        assert me is not None
        self._running.add(me)
        try:
            started = time.perf_counter()
            try:
                await self._call(lease)
            finally:  # (at least 1 µs: a sample of 0 would read as no sample)
                self._handler_s = _average(self._handler_s,
                                           max(1e-6, time.perf_counter() - started))
        except asyncio.CancelledError:
            if not self._abandoning:
                raise  # the worker itself is being torn down: leave the lease as it is
            # stop(finish=False) cancelled the handler: the record goes back at once.
            with contextlib.suppress(VQError):
                await source.retry([lease], reason="worker stopped")
            self._settled(source, [lease])
            raise
        except Exception as exc:
            self.failed += 1
            with contextlib.suppress(VQError):
                await source.retry([lease], delay_ms=self.backoff_ms(lease.attempt),
                                   reason=f"{type(exc).__name__}: {exc}"[:1000])
            self._settled(source, [lease])
            return
        finally:
            self._running.discard(me)
        # Handled: its room goes to the next lease now, not once the completion is back.
        self._handled(source, lease)
        self._done.setdefault(source, []).append(lease)
        self._arm(source)

    async def _call(self, lease: Lease) -> Any:
        if self._is_async:
            return await self.handler(lease)
        return await asyncio.to_thread(self.handler, lease)

    # Completing: on the next lease, or alone ----------------------------------------------

    def _arm(self, source: _Source) -> None:
        """Finished tokens of `source` wait: if no lease takes them within
        `complete_delay_ms`, they are completed in one call of their own."""
        if source not in self._flushers and self._done.get(source):
            self._flushers[source] = asyncio.create_task(self._flush_later(source))

    def _take(self, source: _Source) -> list[Lease]:
        """The finished leases of `source` for the lease about to be sent (none to a node
        that takes no completions on a lease: they are completed alone)."""
        if source in self._no_riding:
            return []
        done = self._done.pop(source, [])
        if len(done) > MAX_RIDING:
            self._done[source] = done[MAX_RIDING:]
            return done[:MAX_RIDING]
        timer = self._flushers.pop(source, None)
        if timer is not None:
            timer.cancel()
        return done

    def _put_back(self, source: _Source, leases: list[Lease], arm: bool = True) -> None:
        """Tokens a failed lease carried: to send again, first."""
        if leases:
            self._done[source] = leases + self._done.get(source, [])
            if arm:
                self._arm(source)

    async def _rode(self, source: _Source, leases: list[Lease], refused: list[Refused]
                    ) -> None:
        """A lease answered the tokens it carried: report the refused; those of a queue the
        node does not serve (prefix) go alone to its owner."""
        if not refused:
            self.completed += len(leases)
            return
        codes = {source.refused_id(r): r.code for r in refused}
        elsewhere = []
        for lease in leases:
            code = codes.get(source.id_of(lease))
            if code is None:
                self.completed += 1
            elif code == "wrong_node":
                elsewhere.append(lease)
            else:
                self._report(source, lease, code)
        if elsewhere:
            await self._complete_at_owners(source, elsewhere, "wrong_node")

    def _report(self, source: _Source, lease: Lease, code: str) -> None:
        """A finished record's completion refused (it may come again): to the hook, or
        else a log line."""
        self.refused += 1
        if self.on_refused is None:
            log.warning("complete_refused", extra={"source": source.name,
                                                   "queue": lease.queue or source.queue,
                                                   "token": lease.token, "code": code})
            return
        try:
            self.on_refused(lease, code)
        except Exception:
            log.exception("on_refused_failed", extra={"token": lease.token})

    async def _flush_later(self, source: _Source) -> None:
        await asyncio.sleep(self.complete_delay_s)
        self._flushers.pop(source, None)
        me = asyncio.current_task()
        assert me is not None
        self._flushing.add(me)  # (stop waits for it)
        try:
            await self._flush(source)
        finally:
            self._flushing.discard(me)

    async def _flush_all(self) -> None:
        for task in list(self._flushers.values()):
            task.cancel()
        self._flushers.clear()
        await asyncio.gather(*self._flushing, return_exceptions=True)
        for source in list(self._done):
            await self._flush(source)

    async def _flush(self, source: _Source) -> None:
        """Complete what the handlers of `source` finished and no lease took, in one call."""
        await self._complete_alone(source, self._done.pop(source, []), reroute=True)

    async def _complete_alone(self, source: _Source, leases: list[Lease], reroute: bool
                              ) -> None:
        """A standalone complete. A token gone stale (its lease expired and another worker
        has the record) is reported and the rest sent again (a complete is all or
        nothing)."""
        while leases:
            try:
                await source.complete(leases)
                self.completed += len(leases)
                return
            except VQError as exc:
                stale = source.stale(exc)
                if stale:
                    for lease in leases:
                        if source.id_of(lease) in stale:
                            self._report(source, lease, exc.code)
                    leases = [x for x in leases if source.id_of(x) not in stale]
                    continue
                if reroute and source.node is not None and \
                        exc.code in ("wrong_node", "connection_error"):
                    await self._complete_at_owners(source, leases, exc.code)
                    return
                log.warning("complete_failed", extra={"source": source.name,
                                                      "error": str(exc)})
                for lease in leases:
                    self._report(source, lease, exc.code)
                return

    async def _complete_at_owners(self, source: _Source, leases: list[Lease], code: str
                                  ) -> None:
        """Prefix leases a node would not complete (`code`): once more, each to its queue's
        owner in the refreshed map; reported if that fails too."""
        self._map_stale.set()
        with contextlib.suppress(VQError):
            await self.client.refresh_map()
        by_owner: dict[str, list[Lease]] = {}
        for lease in leases:
            by_owner.setdefault(self.client.cached_owner(lease.queue or ""), []).append(lease)
        for url, group in by_owner.items():
            if url == source.node and code == "wrong_node":
                for lease in group:  # the map has not moved: nowhere else to send it
                    self._report(source, lease, code)
                continue
            await self._complete_alone(_Source(self.client, self.consumer, node=url), group,
                                       reroute=False)

    def _handled(self, source: _Source, lease: Lease) -> None:
        """The record needs no room and no extending any more (its completion is pending)."""
        lease_id = source.id_of(lease)
        if self._leases.pop(lease_id, None) is not None:
            self._release(1)
        self._deadlines.pop(lease_id, None)

    def _settled(self, source: _Source, leases: list[Lease]) -> None:
        for lease in leases:
            self._handled(source, lease)

    # Extending only what needs it ------------------------------------------------------------

    async def _keeper(self) -> None:
        """Every sixth of `visibility_ms`, extend the unsettled leases whose deadline is less
        than a third of it away: one call per queue (per node for a prefix worker)."""
        period = max(0.05, self.visibility_ms / 6000)
        while True:
            await asyncio.sleep(period)
            soon = time.time() * 1000 + self.visibility_ms / 3
            due: dict[_Source, list[Lease]] = {}
            for lease_id, deadline in self._deadlines.items():
                if deadline < soon:
                    source, lease = self._leases[lease_id]
                    due.setdefault(source, []).append(lease)
            for source, leases in due.items():
                await self._extend(source, leases)

    async def _extend(self, source: _Source, leases: list[Lease]) -> None:
        while leases:
            try:
                deadlines = await source.extend(leases, self.visibility_ms)
            except VQError as exc:
                stale = source.stale(exc)
                log.warning("extend_failed", extra={"source": source.name, "error": str(exc)})
                if not stale:
                    return
                for lease_id in stale:  # lost: nothing to keep alive
                    self._deadlines.pop(lease_id, None)
                leases = [x for x in leases if source.id_of(x) not in stale]
                continue
            for lease_id, deadline in deadlines.items():
                if lease_id in self._deadlines:
                    self._deadlines[lease_id] = deadline
            return


def _average(mean: float, sample: float) -> float:
    """An exponential moving average (the first sample starts it)."""
    return sample if mean <= 0 else mean + 0.2 * (sample - mean)
