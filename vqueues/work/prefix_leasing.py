"""Leasing across a prefix: one pool of workers for every queue under a prefix consumer's
prefix, fair between the queues (docs/work-queues.md, ADR 13).

A prefix lease takes turns of one round over this node's partitions: in a round every queue
that may have records (`ReadyQueues`, one turn order per partition) takes one turn, up to
`records_per_turn` × the queue's `weight` records, never past the queue's in-flight cap.
Calls at once start at different partitions (so they write to different offset partitions)
and share the round: a queue gets as many turns as any other, whichever partition it is in.
Every queue served has its own lease consumer: the lease decides each one's share under that
queue's lock (a queue another call holds is passed over this turn, never waited for), and
writes the decisions of one partition together, in one submission. Settling takes tokens of
many queues; all are checked before any is acted on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Sequence

from vqueues.errors import BadRequest, Conflict, NotFound
from vqueues.queues.entry_writer import PendingWrite
from vqueues.records import ConsumerAcked, OffsetEntry, now_ms
from vqueues.results import (
    PrefixConsumerInfo,
    PrefixLeased,
    PrefixLeaseResult,
    PrefixSettleResult,
    SettleResult,
)
from vqueues.state import prefix_consumers
from vqueues.state.consumer_config import LEASE, configured
from vqueues.state.partition_state import PartitionState
from vqueues.state.prefix_consumers import MAX_PREFIX_CONSUMERS, PrefixConsumer, PrefixConsumers
from vqueues.state.tokens import new_grant
from vqueues.work import settlement
from vqueues.work.prefix_riding import PrefixRiding, RidingPart, prefix_result, ride
from vqueues.work.work_service import (
    LeaseDecision,
    Settle,
    SettleDecision,
    WorkService,
)

log = logging.getLogger(__name__)

BUILD_STEP = 5000  # queue names looked at per loop pass when a partition's turns are built


class Round:
    """A prefix consumer's round over this node's partitions, shared by the calls leasing at
    once: the turns each partition has left in it, and where the next call starts."""

    __slots__ = ("left", "start")

    def __init__(self) -> None:
        self.left: dict[int, int] = {}  # partition -> turns left (none left: a new round)
        self.start = 0


class PrefixLeasing:
    """Prefix consumers: their definitions (written to the assignment topic), leases across
    their queues, and settling tokens of many queues at once."""

    def __init__(self, work: WorkService) -> None:
        self.work = work
        self.queues = work.queues
        self.entries = work.entries
        self.ownership = work.ownership
        self.prefixes: PrefixConsumers = work.ownership.prefixes
        self._locks = work.queues.locks
        self._rounds: dict[str, Round] = {}  # by prefix consumer
        self._building: set[asyncio.Task[None]] = set()
        self.ownership.on_ready.append(self._partition_ready)
        self.prefixes.watch(self._definition_changed)
        for state in self.ownership.states.values():  # ready before this was made
            if state.ready.is_set():
                self._partition_ready(state)

    # Definitions -------------------------------------------------------------------------------

    def get(self, consumer: str) -> PrefixConsumer:
        pc = self.prefixes.by_name.get(consumer)
        if pc is None:
            raise NotFound("prefix_consumer_not_found", f"no prefix consumer {consumer!r}")
        return pc

    async def define(self, consumer: str, body: dict[str, object]) -> PrefixConsumerInfo:
        """Create or change a prefix consumer (cluster-wide; durable before the answer)."""
        settings = self.work.settings
        defaults = self.work.configs.defaults()
        pc = prefix_consumers.checked(consumer, body, defaults, settings.max_visibility_ms,
                                      settings.max_lease_window)
        if consumer not in self.prefixes.by_name and \
                len(self.prefixes.by_name) >= MAX_PREFIX_CONSUMERS:
            raise BadRequest("limit_out_of_range", f"at most {MAX_PREFIX_CONSUMERS} prefix "
                             "consumers", max=MAX_PREFIX_CONSUMERS)
        await self.ownership.announce([prefix_consumers.encode(pc)])
        return self.info(consumer)

    async def delete(self, consumer: str) -> PrefixConsumerInfo:
        """Stop leasing across the prefix; each queue's consumer stays as it is."""
        info = self.info(consumer)
        await self.ownership.announce([prefix_consumers.encode_deleted(consumer)])
        return info

    def info(self, consumer: str) -> PrefixConsumerInfo:
        """A prefix consumer and, on this node: the queues under the prefix it leased from,
        those waiting for a turn, its records in flight, and its backlog (records not done:
        those of the queues it leased from, from their low-water marks, and every record of
        a queue waiting for its first turn). Counted from the windows and the turn orders: no
        idle queue is looked at."""
        pc = self.get(consumer)
        ready = in_flight = queues = backlog = 0
        now = now_ms()
        for state in self.ownership.states.values():
            if not state.ready.is_set():
                continue
            ready += state.ready_queues.size(consumer)
            for queue in state.ready_queues.waiting(consumer):
                q = state.queues.get(queue)
                if q is not None and (queue, consumer) not in state.windows:
                    backlog += len(q.offsets)
            for (queue, c), work in state.windows.items():
                if c == consumer and pc.covers(queue):
                    queues += 1
                    q = state.queues.get(queue)
                    if q is not None:
                        counts = work.counts(q.offsets, state.committed(queue, c) or 0, now)
                        in_flight += counts[0]
                        backlog += sum(counts)
        return PrefixConsumerInfo(pc.consumer, pc.prefix, pc.max_attempts, pc.visibility_ms,
                                  pc.dead_letter_queue, pc.max_in_flight, dict(pc.weights),
                                  pc.records_per_turn, queues, ready, in_flight, backlog,
                                  pc.durable_grants)

    def infos(self) -> list[PrefixConsumerInfo]:
        return [self.info(c) for c in sorted(self.prefixes.by_name)]

    # Leasing -----------------------------------------------------------------------------------

    async def lease(self, consumer: str, max_records: int, visibility_ms: int | None,
                    wait_ms: int, complete: Sequence[tuple[str, str]] | None = None
                    ) -> PrefixLeaseResult:
        """Up to `max_records` records from the queues under the prefix, in this node's
        partitions, queue by queue in turn; waits up to `wait_ms` for one. `complete`:
        (queue, token) pairs finished first, token by token, each partition's in the same
        write as its grants (ADR 16); answered once those writes are durable."""
        pc = self.get(consumer)
        if visibility_ms is not None:
            self.work.check_visibility(visibility_ms)
        deadline = time.monotonic() + wait_ms / 1000
        riding = (await ride(pc, complete, self.ownership, self.queues.partition_of,
                             self._locks) if complete is not None else None)
        try:
            got = await self._lease_once(pc, max_records, visibility_ms, riding)
        finally:
            if riding is not None:
                await riding.finish(self.work, self._locks)
        while True:
            if got:
                self.work.metrics.records_leased.inc(len(got))
                return prefix_result(consumer, got, riding)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.ownership.draining:
                return prefix_result(consumer, [], riding)
            soonest = min((at for s in self.ownership.states.values()
                           if (at := s.ready_queues.next_at(consumer)) is not None),
                          default=None)
            if soonest is not None:  # a lease runs out or a retry falls due before then
                remaining = min(remaining, max(0.001, (soonest - now_ms()) / 1000 + 0.001))
            await self.prefixes.wait(consumer, remaining)
            pc = self.get(consumer)
            got = await self._lease_once(pc, max_records, visibility_ms)

    async def _lease_once(self, pc: PrefixConsumer, max_records: int,
                          visibility_ms: int | None, riding: PrefixRiding | None = None
                          ) -> list[PrefixLeased]:
        """Turns of the round, from the partition after the one the last call started at,
        until `max_records`; a new round when no partition has turns left, until a new round
        finds nothing. One call's turns in a partition make one offset-topic write."""
        consumer = pc.consumer
        out: list[PrefixLeased] = []
        now = now_ms()
        states = sorted((s for s in self.ownership.states.values()
                         if s.ready.is_set() and not s.revoked), key=lambda s: s.partition)
        if not states:
            return out
        round_ = self._rounds.get(consumer)
        if round_ is None:
            round_ = self._rounds[consumer] = Round()
        for state in states:
            for queue in state.ready_queues.due(consumer, now):
                state.recheck_queue(consumer, queue)
        start = next((i for i, s in enumerate(states) if s.partition >= round_.start), 0)
        round_.start = states[start].partition + 1
        states = states[start:] + states[:start]
        left = round_.left
        while len(out) < max_records:
            fresh = not any(left.get(s.partition, 0) > 0 for s in states)
            if fresh:  # a new round: every queue waiting now, once
                for state in states:
                    left[state.partition] = state.ready_queues.size(consumer)
            had = len(out)
            for state in states:
                if left.get(state.partition, 0) > 0:
                    await self._lease_partition(state, pc, max_records - len(out),
                                                visibility_ms, left, out,
                                                riding.take(state.partition)
                                                if riding is not None else None)
                    if len(out) >= max_records:
                        return out
            if fresh and len(out) == had:
                break
        return out

    async def _lease_partition(self, state: PartitionState, pc: PrefixConsumer, wanted: int,
                               visibility_ms: int | None, left: dict[int, int],
                               out: list[PrefixLeased], riding: RidingPart | None = None
                               ) -> None:
        """Lease up to `wanted` records from `state`'s queues in turn, while the round has
        turns of it left (`left`, by partition); the records go to `out`. `riding`: the
        completions the call decided in this partition, whose locks it holds: written first,
        in the same write, which the answer then waits for."""
        consumer, p = pc.consumer, state.partition
        held: list[tuple[str, str, str]] = list(riding.keys) if riding is not None else []
        own = set(held)
        decisions: list[LeaseDecision] = []
        entries: list[OffsetEntry] = list(riding.entries) if riding is not None else []
        grant = new_grant()
        taken = 0
        try:
            while taken < wanted and left.get(p, 0) > 0:
                turns = self._next_turns(state, pc, wanted - taken, left, held, own)
                if not turns:
                    break
                await self._make_consumers(state, pc, [q for q, _ in turns])
                for queue, turn in turns:
                    share = min(turn, wanted - taken)
                    decision = await self._decide(state, pc, queue, share, visibility_ms,
                                                  grant, entries)
                    if state.revoked:
                        if riding is not None:
                            riding.lost = True
                        return
                    got = len(decision.chosen) if decision is not None else 0
                    if decision is not None:
                        decisions.append(decision)
                        entries += decision.entries
                        taken += got
                    _after_turn(state, consumer, queue, turn, share, got, left)
            durable = (self.entries.submit(state, entries, applied=True)
                       if entries and not state.revoked else None)
            if riding is not None and state.revoked:
                riding.lost = True
        finally:
            for key in held:
                self._locks.release(key)
        if durable is not None:
            await self._answer_partition(state, durable, decisions, riding, out)

    async def _answer_partition(self, state: PartitionState, durable: PendingWrite,
                                decisions: list[LeaseDecision], riding: RidingPart | None,
                                out: list[PrefixLeased]) -> None:
        """A partition's write submitted: waited for if it carries completions or durable
        grants (undone if it fails), else finished behind; then its records to `out`."""
        if (riding is not None and riding.queues) or any(d.durable for d in decisions):
            try:
                await durable
            except BaseException:
                for decision in decisions:
                    decision.undo()
                raise
            if riding is not None:
                riding.completed(self.work, state)
        else:
            self.work.write_behind(state, durable, sum(len(d.chosen) for d in decisions))
        for decision in decisions:
            leased = await self.work.leased(state, decision)
            out.extend(PrefixLeased(decision.queue, state.partition, one) for one in leased)

    def _next_turns(self, state: PartitionState, pc: PrefixConsumer, need: int,
                    left: dict[int, int], held: list[tuple[str, str, str]],
                    own: set[tuple[str, str, str]]) -> list[tuple[str, int]]:
        """The queues of the next turns, as many as the `need` records still wanted need:
        (queue, records its turn may take), each queue's lock taken (added to `held`)."""
        consumer, rq, p = pc.consumer, state.ready_queues, state.partition
        turns: list[tuple[str, int]] = []
        while need > 0 and left.get(p, 0) > 0:
            found = rq.take(consumer)
            if found is None:
                left[p] = 0
                break
            queue, owed = found
            left[p] -= 1
            key = ("c", queue, consumer)
            if key in own or self._locks.try_hold(key):
                if key not in own:
                    held.append(key)
                turn = owed or pc.records_per_turn * pc.weight_of(queue)
                turns.append((queue, turn))
                # what it may give: a queue of a few records gives no more, so a lease over
                # many small queues takes enough of them per write
                q = state.queues.get(queue)
                need -= min(turn, len(q.offsets)) if q is not None else 0
            else:
                rq.add(consumer, queue)  # another call is at it: its turn comes again
        return turns

    async def _make_consumers(self, state: PartitionState, pc: PrefixConsumer,
                              queues: list[str]) -> None:
        """The queues of these turns whose consumer does not exist yet get it, with the prefix
        consumer's settings, in one durable write (under their locks)."""
        consumer = pc.consumer
        entries: list[OffsetEntry] = []
        now = now_ms()
        for queue in queues:
            q = state.queues.get(queue)
            if q is None or not q.offsets or (queue, consumer) in state.configs \
                    or state.committed(queue, consumer) is not None:
                continue  # made already, or a cursor consumer (it has acked): kept out
            entries.append(ConsumerAcked(queue, consumer, state.first_offset(queue), now))
            entries.append(configured(queue, consumer, pc.config_for(queue)))
        if entries:
            await self.entries.write(state, entries)

    async def _decide(self, state: PartitionState, pc: PrefixConsumer, queue: str, share: int,
                      visibility_ms: int | None, grant: int, entries: list[OffsetEntry]
                      ) -> LeaseDecision | None:
        """One queue's share of a prefix lease (under its lock; its consumer made by
        `_make_consumers`). The consumer follows a change of the prefix consumer's settings (a
        settings entry ahead of the lease's, in the same write) unless it was set on its own;
        a cursor consumer by that name keeps the queue out."""
        q = state.queues.get(queue)
        if q is None or not q.offsets:
            return None  # gone, or nothing left to lease
        consumer = pc.consumer
        config = state.configs.get((queue, consumer))
        work = state.windows.get((queue, consumer))
        if config is None or work is None or config.mode != LEASE:
            return None
        config, change = self.work.configs.follow_prefix(state, queue, consumer, config)
        if change is not None:
            entries.append(change)
        return await self.work.decide_lease(state, queue, consumer, work, config, share,
                                            visibility_ms, None, grant)

    # Building the turns -----------------------------------------------------------------------

    def _partition_ready(self, state: PartitionState) -> None:
        for pc in list(self.prefixes.by_name.values()):
            self._spawn_build(state, pc)

    def _definition_changed(self, consumer: str, pc: PrefixConsumer | None) -> None:
        for state in self.ownership.states.values():
            state.ready_queues.forget(consumer)
            if pc is not None and state.ready.is_set():
                self._spawn_build(state, pc)
        self._rounds.pop(consumer, None)
        self.prefixes.wake(consumer)

    def _spawn_build(self, state: PartitionState, pc: PrefixConsumer) -> None:
        task = self.ownership.loop.create_task(self._build(state, pc))
        self._building.add(task)
        task.add_done_callback(self._building.discard)

    async def _build(self, state: PartitionState, pc: PrefixConsumer) -> None:
        """Every queue under the prefix with a record to lease takes a turn (one with its
        records all in flight is timed instead): the partition's sorted names, from the
        prefix on, BUILD_STEP per loop pass."""
        for count, name in enumerate(state.queue_names(pc.prefix, None), 1):
            if not name.startswith(pc.prefix):
                break
            if state.revoked or self.prefixes.by_name.get(pc.consumer) is not pc:
                return
            if not self._locks.held(("c", name, pc.consumer)):  # else its holder rechecks it
                state.recheck_queue(pc.consumer, name)
            if count % BUILD_STEP == 0:
                await asyncio.sleep(0)

    # Settling ----------------------------------------------------------------------------------

    async def settle(self, consumer: str, how: Settle, tokens: Sequence[tuple[str, str]]
                     ) -> PrefixSettleResult:
        """Complete, retry or extend leases of many queues: (queue, token) pairs. All or
        nothing: if any token is stale, 409 names every stale one and nothing is done."""
        pc = self.get(consumer)
        by_queue: dict[str, list[str]] = {}
        for queue, token in tokens:
            by_queue.setdefault(queue, []).append(token)
        for queue in by_queue:
            if not pc.covers(queue):
                raise BadRequest("invalid_parameter", f"queue {queue!r} is not under the "
                                 f"prefix {pc.prefix!r}")
        checked = {q: settlement.parse_tokens(t) for q, t in by_queue.items()}
        states = {q: self.ownership.require(self.queues.partition_of(q)) for q in checked}
        keys = sorted(("c", q, consumer) for q in checked)  # one order: no two calls deadlock
        held = []
        durables: list[Awaitable[None]] = []
        decisions: list[tuple[PartitionState, SettleDecision]] = []
        try:
            for key in keys:
                await self._locks.acquire(key)
                held.append(key)
            found, stale = self._check(states, consumer, checked, how)
            if stale:
                raise Conflict("lease_expired", f"{len(stale)} token(s) are not current",
                               stale=stale)
            by_partition: dict[int, list[OffsetEntry]] = {}
            for queue, toks in checked.items():
                state = states[queue]
                decision = await self.work.decide_settle(state, queue, consumer, how, toks,
                                                         found[queue])
                decisions.append((state, decision))
                if decision.submitted is not None:
                    durables.append(decision.submitted)
                by_partition.setdefault(state.partition, []).extend(decision.entries)
            for queue_state in {s.partition: s for s in states.values()}.values():
                entries = by_partition.get(queue_state.partition)
                if entries:
                    durables.append(self.entries.submit(queue_state, entries,
                                                               applied=True))
        finally:
            for key in held:
                self._locks.release(key)
        for durable in durables:
            await durable
        results: list[SettleResult] = [self.work.settled(state, decision)
                                       for state, decision in decisions]
        return PrefixSettleResult(consumer, results)

    @staticmethod
    def _check(states: dict[str, PartitionState], consumer: str,
               checked: dict[str, list[str]], how: Settle
               ) -> tuple[dict[str, settlement.Checked], list[dict[str, str]]]:
        """Every queue's tokens checked: what each check found, and the stale tokens."""
        found: dict[str, settlement.Checked] = {}
        stale: list[dict[str, str]] = []
        for queue, toks in checked.items():
            try:
                found[queue] = settlement.check_tokens(states[queue], queue, consumer, toks,
                                                       how.kind == "complete")
            except Conflict as exc:
                if exc.code != "lease_expired":
                    raise
                stale += [{"queue": queue, "token": str(t)}
                          for t in exc.details.get("stale") or toks]
        return found, stale


def _after_turn(state: PartitionState, consumer: str, queue: str, turn: int, share: int,
                got: int, left: dict[int, int]) -> None:
    """Where `queue` goes once its share of a turn (`got` of `share`, of a `turn`) is
    leased: on in this round, back for its next turn, or back when a lease runs out."""
    rq, p = state.ready_queues, state.partition
    work = state.windows.get((queue, consumer))
    if got >= share and share < turn and state.may_lease(consumer, queue):
        # The call's end cut its turn short.
        rq.resume(consumer, queue, turn - share)
        left[p] = left.get(p, 0) + 1  # its turn goes on, in this round
    elif got >= share:
        state.recheck_queue(consumer, queue)  # its next turn, if it has more
    elif work is not None:  # nothing more now: back when a lease runs out
        change = work.next_change(now_ms())
        if change is not None:
            rq.later(consumer, queue, change)
