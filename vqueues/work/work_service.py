"""The work-queue calls: lease, complete, retry, extend and consumer settings, on the same queues
as the cursors (docs/work-queues.md, ADR 8).

Every change is an offset-topic entry. A call takes the consumer's lock, decides, applies its
entries to the partition state at once and hands them to the producer in that order
(`EntryWriter.submit`), releases the lock, and answers once they are durable: workers
see each other's leases at once, and a failover replays exactly what was answered. The
decisions are the parts': `consumer_configs` (settings), `lease_choice` (what a lease takes),
`settlement` (tokens and the entries that settle records), `dead_letters`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass

from vqueues.errors import BadRequest, Conflict, Unavailable
from vqueues.queues.entry_writer import EntryWriter, PendingWrite
from vqueues.queues.record_reader import RecordReader
from vqueues.queues.service import QueueService
from vqueues.records import OffsetEntry, Record, now_ms
from vqueues.results import (
    CompletedTokens,
    ConsumerSettings,
    LeasedRecord,
    LeaseResult,
    RefusedToken,
    SettleResult,
)
from vqueues.settings import Settings
from vqueues.state.consumer_config import LEASE, ConsumerConfig
from vqueues.state.partition_state import PartitionState
from vqueues.state.tokens import new_grant, parse_token, token
from vqueues.state.window import LeaseWindow
from vqueues.state.window_writes import WindowWrite
from vqueues.work import settlement
from vqueues.work.consumer_configs import ConsumerConfigs
from vqueues.work.dead_letters import DeadLetters
from vqueues.work.lease_choice import LeaseChoice

__all__ = ["COMPLETE", "EXTEND", "MAX_REASON_CHARS", "RETRY", "LeaseDecision", "Settle",
           "SettleDecision", "WorkService"]

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 1000


COMPLETE, RETRY, EXTEND = "complete", "retry", "extend"


@dataclass(slots=True, frozen=True)
class Settle:
    """What a settle call does: complete; retry (`number`: the delay in ms, `reason`); extend
    (`number`: the new visibility in ms)."""

    kind: str
    number: int = 0
    reason: str | None = None


@dataclass(slots=True)
class SettleDecision:
    """A settle decided under a consumer's lock and applied to its window."""

    queue: str
    consumer: str
    kind: str
    entries: list[OffsetEntry]
    done: list[str]  # the tokens acted on
    dead: list[str]  # (retry) the tokens whose records went to the dead letters
    count: int  # records completed or given back
    until: int | None  # (extend) the new deadline
    submitted: Awaitable[None] | None = None  # a write of it already submitted, to await


@dataclass(slots=True)
class LeaseDecision:
    """A lease decided under a consumer's lock and applied to its window: the entries to
    submit, the records it takes (`before`: each one's (offset, attempts, grant, until,
    leased, first) as it was), and what each token will carry; `at`: when it was granted."""

    queue: str
    work: LeaseWindow
    entries: list[OffsetEntry]
    chosen: list[int]
    seen: dict[int, Record]
    before: list[tuple[int, int, int, int, bool, int]]
    until: int
    grant: int
    at: int
    durable: bool = False  # the consumer's durable_grants: answered once the write is

    def undo(self) -> None:
        """The write failed, so nothing was handed out: give the records back as they were
        (those another call has changed since are left alone)."""
        now = now_ms()
        work = self.work
        for off, attempts, old_grant, old_until, leased, first in self.before:
            cur = work.deliveries.get(off)
            if cur is not None and cur.grant == self.grant:
                work.put(off, leased, old_until, attempts, old_grant, cur.reason, now)
                cur.first = first


class WorkService:
    def __init__(self, settings: Settings, queues: QueueService, entries: EntryWriter,
                 reader: RecordReader) -> None:
        self.settings = settings
        self.queues = queues
        self.entries = entries  # the offset-topic writes of lease state
        self.reader = reader  # records by offset, for leases and dead letters
        self.ownership = queues.ownership
        self.metrics = queues.metrics
        self._locks = queues.locks
        self.configs = ConsumerConfigs(settings, queues, entries)
        self.choice = LeaseChoice(settings, reader)
        self.dead_letters = DeadLetters(queues, entries, reader)

    # Settings (`ConsumerConfigs`) --------------------------------------------------------------

    def check_visibility(self, visibility_ms: int, name: str = "visibility_ms") -> int:
        return self.configs.check_visibility(visibility_ms, name)

    async def configure(self, queue: str, consumer: str, mode: str | None,
                        max_attempts: int | None, dead_letter_queue: str | bool | None,
                        visibility_ms: int | None, max_in_flight: int | bool | None = False,
                        prefix: str | None = None, durable_grants: bool | None = None,
                        attributes: Mapping[str, str] | None = None) -> ConsumerSettings:
        return await self.configs.configure(queue, consumer, mode, max_attempts,
                                            dead_letter_queue, visibility_ms, max_in_flight,
                                            prefix, durable_grants, attributes)

    def consumer_settings(self, queue: str, consumer: str) -> ConsumerSettings:
        return self.configs.settings_of(queue, consumer)

    # Leasing -----------------------------------------------------------------------------------

    async def lease(self, queue: str, consumer: str, max_records: int,
                    visibility_ms: int | None, wait_ms: int, tag: str | None = None,
                    complete: Sequence[str] | None = None) -> LeaseResult:
        """Up to `max_records` records this consumer has neither completed nor leased out,
        lowest offset first, one per ordering key at a time; waits up to `wait_ms` for one.
        With `tag`, new records without it are completed as skipped (the consumer's filter).
        `complete`: tokens finished first, token by token, in the same write as the grants
        (ADR 16); the answer comes once that write is durable and says what each did."""
        if visibility_ms is not None:
            self.check_visibility(visibility_ms)
        p = self.queues.partition_of(queue)
        deadline = time.monotonic() + wait_ms / 1000
        riding = Riding(complete) if complete is not None else None
        while True:
            state = self.ownership.require(p)
            got = await self._lease_once(state, queue, consumer, max_records, visibility_ms,
                                         tag, riding)
            riding = riding.answered() if riding is not None else None
            if got:
                self.metrics.records_leased.inc(len(got))
                return _result(p, got, riding)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.ownership.draining:
                return _result(p, [], riding)
            work = state.windows.get((queue, consumer))
            change = work.next_change(now_ms()) if work is not None else None
            if change is not None:  # a lease expires or a retry falls due before then
                remaining = min(remaining, max(0.001, (change - now_ms()) / 1000 + 0.001))
            await state.wait_for_records(queue, remaining)

    async def _lease_once(self, state: PartitionState, queue: str, consumer: str,
                          max_records: int, visibility_ms: int | None, tag: str | None,
                          riding: Riding | None = None) -> list[LeasedRecord]:
        async with self._locks.hold(("c", queue, consumer)):
            config = state.configs.get((queue, consumer))
            work = state.windows.get((queue, consumer))
            if work is None or config is None or config.mode != LEASE:
                work, config = await self.configs.lease_consumer(state, queue, consumer)
            config, change = self.configs.follow_prefix(state, queue, consumer, config)
            first: list[OffsetEntry] = [] if change is None else [change]
            done = (riding.take(state, queue, consumer, work)
                    if riding is not None and riding.tokens else None)
            decision = await self.decide_lease(state, queue, consumer, work, config,
                                               max_records, visibility_ms, tag, new_grant(),
                                               done)
            if decision is None:
                if done is not None:
                    first += done.entries()
                completed = riding.count if riding is not None else 0
                if state.revoked:
                    if completed:  # never answered as completed unless written
                        self.ownership.require(state.partition)
                        raise Unavailable("partition_unavailable", f"partition "
                                          f"{state.partition} moved during the call; retry",
                                          partition=state.partition)
                    return []
                if first:
                    written = self.entries.submit(state, first, applied=True)
                    if completed:
                        await written
                        self._completed(state, queue, completed)
                    else:
                        self.write_behind(state, written, 0)
                return []
            entries = [*first, *decision.entries] if first else decision.entries
            durable = self.entries.submit(state, entries, applied=True)
        completed = riding.count if riding is not None else 0
        if completed or config.durable_grants:  # answered once durable
            try:
                await durable
            except BaseException:
                decision.undo()
                raise
            if completed:
                self._completed(state, queue, completed)
        else:
            self.write_behind(state, durable, len(decision.chosen))
        return await self.leased(state, decision)

    async def complete_riding(self, queue: str, consumer: str, tokens: Sequence[str]
                              ) -> CompletedTokens:
        """Tokens a stream's credit carries (ADR 16), completed as a lease's riding ones are:
        token by token, in one write, answered once it is durable."""
        p = self.queues.partition_of(queue)
        riding = Riding(tokens)
        async with self._locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            work = state.windows.get((queue, consumer))
            entries: list[OffsetEntry] = []
            if work is None:
                config = state.configs.get((queue, consumer))
                if config is not None and config.mode != LEASE:
                    raise Conflict("consumer_mode_mismatch", f"consumer {consumer!r} is a "
                                   "cursor consumer", mode=config.mode)
                riding.refuse_all("lease_expired")  # it holds no lease: none is current
            elif riding.tokens:
                entries = riding.decide(state, queue, consumer, work)
            durable = self.entries.submit(state, entries, applied=True) if entries else None
        if durable is not None:
            await durable
            self._completed(state, queue, riding.count)
        return CompletedTokens(riding.done, riding.refused)

    def _completed(self, state: PartitionState, queue: str, count: int) -> None:
        """A lease's riding completions are durable: counted, and parked leasers go on."""
        self.metrics.records_completed.inc(count)
        state.wake(queue)

    def write_behind(self, state: PartitionState, durable: PendingWrite, granted: int
                     ) -> None:
        """A lease's write finished behind its answer (ADR 16). If it fails, the records stay
        leased here (their worker has them) and the failure is counted: a new owner, which
        never sees the grants, may lease them again before their deadline."""
        def failed(exc: BaseException) -> None:
            self.metrics.grant_writes_failed.inc()
            log.warning("grant_write_failed", extra={
                "partition": state.partition, "records": granted, "error": repr(exc)})
        durable.behind(failed)

    async def decide_lease(self, state: PartitionState, queue: str, consumer: str,
                           work: LeaseWindow, config: ConsumerConfig, max_records: int,
                           visibility_ms: int | None, tag: str | None, grant: int,
                           write: WindowWrite | None = None) -> LeaseDecision | None:
        """Under the consumer's lock: what a lease of up to `max_records` takes (never past
        the consumer's in-flight cap), set in the window at once, and the write that says so
        (not yet submitted; `LeaseDecision.undo` gives the records back if it fails). None if
        it takes nothing and finishes nothing. `write`: the call's write so far (its riding
        completions), which the grants join; with None it is the caller's to submit."""
        visibility = visibility_ms or config.visibility_ms
        if work.needs_keys:
            await self.choice.prepare(state, queue, consumer, work, config)
        else:
            work.ensure_index(now_ms(), config.max_attempts, config.max_in_flight is not None)
        exhausted = work.exhausted()
        if exhausted:
            await self.dead_letters.send(state, queue, consumer, config,
                                         {o: "lease expired" for o in exhausted})
            work.ensure_index(now_ms(), config.max_attempts, config.max_in_flight is not None)
        if config.max_in_flight is not None:
            max_records = min(max_records, config.max_in_flight - work.in_flight())
            if max_records <= 0:
                return None
        chosen, skipped, seen = await self.choice.choose(state, queue, consumer, work,
                                                         max_records, tag)
        if state.revoked or (not chosen and not skipped):
            return None
        if write is None:
            write = WindowWrite(state, queue, consumer, work)
        write.finish(skipped)  # not for this consumer's filter: their completion
        now = write.now
        until = now + visibility
        before = []
        deliveries = work.deliveries
        for off in chosen:
            d = deliveries[off]
            before.append((off, d.attempts, d.grant, d.until, d.leased, d.first))
            if not d.first:
                d.first = now
            write.put(off, True, until, d.attempts + 1, grant, d.reason)
        return LeaseDecision(queue, work, write.entries(), chosen, seen, before, until, grant,
                             now, config.durable_grants)

    async def leased(self, state: PartitionState, decision: LeaseDecision
                     ) -> list[LeasedRecord]:
        """The records a durable lease took, with their tokens."""
        chosen, seen, grant, until = (decision.chosen, decision.seen, decision.grant,
                                      decision.until)
        if not chosen:
            return []
        records = {off: seen[off] for off in chosen if off in seen}
        if len(records) < len(chosen):
            records.update((r.offset, r) for r in await self.reader.resolve(
                state.partition, [off for off in chosen if off not in seen]))
        out = []
        at = decision.at
        for off, attempts, _, _, _, first in decision.before:
            rec = records.get(off)
            if rec is not None:  # gone only if retention removed it meanwhile
                attempt = attempts + 1
                out.append(LeasedRecord(rec, token(off, attempt, grant), attempt, until,
                                        first or at))
        return out

    def lease_deadlines(self, queue: str, consumer: str, tokens: Sequence[str]
                        ) -> list[int | None]:
        """Each token's lease deadline (UTC ms) while the token is its record's lease (not
        completed, given back or leased again since), else None. The deadline may have
        passed."""
        state = self.ownership.require(self.queues.partition_of(queue))
        work = state.windows.get((queue, consumer))
        out: list[int | None] = []
        for text in tokens:
            parsed = parse_token(text)
            d = work.deliveries.get(parsed[0]) if work is not None and parsed else None
            current = d is not None and parsed is not None and d.leased and \
                d.attempts == parsed[1] and d.grant == parsed[2]
            out.append(d.until if current and d is not None else None)
        return out

    async def dead_letter_expired(self, state: PartitionState, queue: str, consumer: str
                                  ) -> int:
        """Send the consumer's records whose last attempt expired to the dead letters now;
        returns how many went."""
        async with self._locks.hold(("c", queue, consumer)):
            work = state.windows.get((queue, consumer))
            if work is None or state.revoked:
                return 0
            config = self.configs.of(state, queue, consumer)
            await self.choice.prepare(state, queue, consumer, work, config)
            exhausted = work.exhausted()
            if exhausted:
                await self.dead_letters.send(state, queue, consumer, config,
                                             {o: "lease expired" for o in exhausted})
            return len(exhausted)

    # Settling ----------------------------------------------------------------------------------

    @staticmethod
    def parse_tokens(tokens: object) -> list[str]:
        """A request's `tokens`, checked (400 invalid_token)."""
        return settlement.parse_tokens(tokens)

    def check_retry(self, delay_ms: int, reason: object) -> str | None:
        """A retry's `delay_ms` and `reason`, checked; the reason as kept."""
        hi = self.settings.max_retry_delay_ms
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or \
                not 0 <= delay_ms <= hi:
            raise BadRequest("limit_out_of_range", f"delay_ms must be an integer between 0 and "
                             f"{hi}", parameter="delay_ms", min=0, max=hi)
        if reason is not None and not isinstance(reason, str):
            raise BadRequest("invalid_parameter", "reason must be a string")
        return reason[:MAX_REASON_CHARS] if reason else None

    async def complete(self, queue: str, consumer: str, tokens: list[str]) -> SettleResult:
        """Finish the leased records for good (idempotent for records already done)."""
        return await self._settle(queue, consumer, Settle(COMPLETE), tokens)

    async def retry(self, queue: str, consumer: str, tokens: list[str], delay_ms: int,
                    reason: str | None) -> SettleResult:
        """Give leased records back, available again after `delay_ms`; a record that used up
        its attempts goes to the dead letters instead."""
        kept = self.check_retry(delay_ms, reason)
        return await self._settle(queue, consumer, Settle(RETRY, delay_ms, kept), tokens)

    async def extend(self, queue: str, consumer: str, tokens: list[str], visibility_ms: int
                     ) -> SettleResult:
        """Move the leases' deadline to now + `visibility_ms`."""
        self.check_visibility(visibility_ms)
        return await self._settle(queue, consumer, Settle(EXTEND, visibility_ms), tokens)

    async def _settle(self, queue: str, consumer: str, how: Settle, tokens: list[str]
                      ) -> SettleResult:
        p = self.queues.partition_of(queue)
        async with self._locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            decision = await self.decide_settle(state, queue, consumer, how, tokens)
            durable = (self.entries.submit(state, decision.entries, applied=True)
                       if decision.entries else None)
        if decision.submitted is not None:
            await decision.submitted
        if durable is not None:
            await durable
        return self.settled(state, decision)

    async def decide_settle(self, state: PartitionState, queue: str, consumer: str,
                            how: Settle, tokens: list[str],
                            checked: settlement.Checked | None = None) -> SettleDecision:
        """Under the consumer's lock: a complete, retry or extend of `tokens` (409 and nothing
        done if any is stale; `checked`: what `settlement.check_tokens` said of them just
        now) applied to the window, and its write (not yet submitted). A retry's records past
        their attempts go to the dead letters here, durably."""
        work, act, already = checked or settlement.check_tokens(
            state, queue, consumer, tokens, how.kind == COMPLETE)
        write = WindowWrite(state, queue, consumer, work)
        dead_tokens: list[str] = []
        until = None
        if how.kind == COMPLETE:
            write.finish([o for _, o in act])
            done = [t for t, _ in act] + already
            count = len(act)
        elif how.kind == RETRY:
            config = self.configs.of(state, queue, consumer)
            until = write.now + how.number
            dead: dict[int, str] = {}
            count = 0
            for text, off in act:
                d = work.deliveries[off]
                if d.attempts >= config.max_attempts:
                    dead[off] = how.reason or "retried"
                    dead_tokens.append(text)
                else:
                    write.put(off, False, until, d.attempts, d.grant, how.reason)
                    count += 1
            done, until = [t for t, _ in act], None
            if dead:  # the retries' write first, then the dead letters' (in that order)
                entries = write.entries() if write else []
                first = (self.entries.submit(state, entries, applied=True)
                         if entries else None)
                await self.dead_letters.send(state, queue, consumer, config, dead)
                return SettleDecision(queue, consumer, how.kind, [], done, dead_tokens, count,
                                      until, first)
        else:
            until = write.now + how.number
            for _, off in act:
                d = work.deliveries[off]
                write.put(off, True, until, d.attempts, d.grant, d.reason)
            done, count = [t for t, _ in act], 0
        return SettleDecision(queue, consumer, how.kind, write.entries() if write else [],
                              done, dead_tokens, count, until)

    def settled(self, state: PartitionState, decision: SettleDecision) -> SettleResult:
        """The answer to a durable settle; leasers parked on the queue go on."""
        if decision.kind == COMPLETE:
            self.metrics.records_completed.inc(decision.count)
        elif decision.kind == RETRY:
            self.metrics.records_retried.inc(decision.count)
        if decision.kind != EXTEND:
            state.wake(decision.queue)  # the window moved, a key is free
        return SettleResult(decision.queue, decision.consumer, decision.done, decision.dead,
                            state.committed(decision.queue, decision.consumer) or 0,
                            decision.until)


class Riding:
    """Tokens a lease call completes before it leases, or a stream's credit carries (ADR 16),
    token by token: `decide` applies them to the window under the consumer's lock and gives
    the entries to write (with the grants, for a lease); `done` and `refused` are the
    answer."""

    __slots__ = ("count", "done", "refused", "tokens")

    def __init__(self, tokens: Sequence[str]) -> None:
        parsed: dict[str, tuple[int, int, int]] = {}
        self.refused: list[RefusedToken] = []
        for t in dict.fromkeys(tokens):  # repeats dropped, order kept
            got = parse_token(t)
            if got is None:
                self.refused.append(RefusedToken(t, "invalid_token"))
            else:
                parsed[t] = got
        self.tokens: list[str] = settlement.Tokens(parsed)  # parsed once
        self.done: list[str] = []
        self.count = 0  # records this call completed (not those found done)

    def take(self, state: PartitionState, queue: str, consumer: str, work: LeaseWindow
             ) -> WindowWrite | None:
        """The completions, finished in the window now, in a write the lease's grants join
        (one offset-topic entry for both); None if none is current."""
        stale: list[str] = []
        _, act, already = settlement.check_tokens(state, queue, consumer, self.tokens, True,
                                                  stale)
        self.refused += [RefusedToken(t, "lease_expired") for t in stale]
        self.done = [t for t, _ in act] + already
        self.count = len(act)
        self.tokens = []  # decided once: a long poll's later passes complete nothing
        if not act:
            return None
        write = WindowWrite(state, queue, consumer, work)
        write.finish_now([o for _, o in act])
        return write

    def decide(self, state: PartitionState, queue: str, consumer: str, work: LeaseWindow
               ) -> list[OffsetEntry]:
        """`take`'s write on its own: the entries to submit."""
        write = self.take(state, queue, consumer, work)
        return write.entries() if write is not None else []

    def refuse_all(self, code: str) -> None:
        """None of the tokens is current (the consumer holds no lease)."""
        self.refused += [RefusedToken(t, code) for t in self.tokens]
        self.tokens = []

    def answered(self) -> Riding:
        """Past the first pass: nothing left to complete, nothing more to wait for."""
        self.count = 0
        return self


def _result(partition: int, records: list[LeasedRecord], riding: Riding | None) -> LeaseResult:
    if riding is None:
        return LeaseResult(partition, records)
    return LeaseResult(partition, records, riding.done, riding.refused)
