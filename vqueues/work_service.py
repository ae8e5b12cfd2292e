"""The work-queue calls: lease, complete, retry, extend and consumer settings, on the same queues
as the cursors (docs/work-queues.md, ADR 8).

Every change is an offset-topic entry. A call takes the consumer's lock, decides, applies its
entries to the partition state at once and hands them to the producer in that order
(`QueueService.submit_entries`), releases the lock, and answers once they are durable: workers
see each other's leases at once, and a failover replays exactly what was answered. The
decisions are the parts': `consumer_configs` (settings), `lease_choice` (what a lease takes),
`settlement` (tokens and the entries that settle records), `dead_letters`.
"""

from __future__ import annotations

import time

from vqueues import settlement
from vqueues.consumer_configs import MAX_ATTEMPTS_LIMIT, ConsumerConfigs
from vqueues.dead_letters import DeadLetters
from vqueues.errors import BadRequest
from vqueues.lease_choice import LeaseChoice
from vqueues.leases import LEASE, new_grant, token
from vqueues.partition_state import PartitionState
from vqueues.records import now_ms
from vqueues.results import ConsumerSettings, LeasedRecord, LeaseResult, SettleResult
from vqueues.service import QueueService
from vqueues.settings import Settings
from vqueues.window_writes import WindowWrite

__all__ = ["MAX_ATTEMPTS_LIMIT", "MAX_REASON_CHARS", "WorkService"]

MAX_REASON_CHARS = 1000


class WorkService:
    def __init__(self, settings: Settings, queues: QueueService) -> None:
        self.settings = settings
        self.queues = queues
        self.ownership = queues.ownership
        self.metrics = queues.metrics
        self._locks = queues.locks
        self.configs = ConsumerConfigs(settings, queues)
        self.choice = LeaseChoice(settings, queues)
        self.dead_letters = DeadLetters(queues)

    # Settings (`ConsumerConfigs`) --------------------------------------------------------------

    def check_visibility(self, visibility_ms: int, name: str = "visibility_ms") -> int:
        return self.configs.check_visibility(visibility_ms, name)

    async def configure(self, queue: str, consumer: str, mode: str | None,
                        max_attempts: int | None, dead_letter_queue: str | bool | None,
                        visibility_ms: int | None) -> ConsumerSettings:
        return await self.configs.configure(queue, consumer, mode, max_attempts,
                                            dead_letter_queue, visibility_ms)

    def consumer_settings(self, queue: str, consumer: str) -> ConsumerSettings:
        return self.configs.settings_of(queue, consumer)

    # Leasing -----------------------------------------------------------------------------------

    async def lease(self, queue: str, consumer: str, max_records: int,
                    visibility_ms: int | None, wait_ms: int, tag: str | None = None
                    ) -> LeaseResult:
        """Up to `max_records` records this consumer has neither completed nor leased out,
        lowest offset first, one per ordering key at a time; waits up to `wait_ms` for one.
        With `tag`, new records without it are completed as skipped (the consumer's filter)."""
        if visibility_ms is not None:
            self.check_visibility(visibility_ms)
        p = self.queues.partition_of(queue)
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            state = self.ownership.require(p)
            got = await self._lease_once(state, queue, consumer, max_records, visibility_ms,
                                         tag)
            if got:
                self.metrics.records_leased.inc(len(got))
                return LeaseResult(p, got)
            remaining = deadline - time.monotonic()
            if remaining <= 0 or self.ownership.draining:
                return LeaseResult(p, [])
            work = state.work.get((queue, consumer))
            change = work.next_change(now_ms()) if work is not None else None
            if change is not None:  # a lease expires or a retry falls due before then
                remaining = min(remaining, max(0.001, (change - now_ms()) / 1000 + 0.001))
            await state.wait_for_records(queue, remaining)

    async def _lease_once(self, state: PartitionState, queue: str, consumer: str,
                          max_records: int, visibility_ms: int | None, tag: str | None
                          ) -> list[LeasedRecord]:
        async with self._locks.hold(("c", queue, consumer)):
            config = state.configs.get((queue, consumer))
            work = state.work.get((queue, consumer))
            if work is None or config is None or config.mode != LEASE:
                work, config = await self.configs.lease_consumer(state, queue, consumer)
            visibility = visibility_ms or config.visibility_ms
            if work.needs_keys:
                await self.choice.prepare(state, queue, consumer, work, config)
            else:
                work.ensure_index(now_ms(), config.max_attempts)
            exhausted = work.exhausted()
            if exhausted:
                await self.dead_letters.send(state, queue, consumer, config,
                                             {o: "lease expired" for o in exhausted})
                work.ensure_index(now_ms(), config.max_attempts)
            chosen, skipped, seen = await self.choice.choose(state, queue, consumer, work,
                                                             max_records, tag)
            if state.revoked or (not chosen and not skipped):
                return []
            write = WindowWrite(state, queue, consumer, work)
            write.finish(skipped)  # not for this consumer's filter: their completion
            grant = new_grant()
            until = write.now + visibility
            before = {}
            deliveries = work.deliveries
            for off in chosen:
                d = deliveries[off]
                before[off] = (d.attempts, d.grant, d.until, d.leased)
                write.put(off, True, until, d.attempts + 1, grant, d.reason)
            durable = self.queues.submit_entries(state, write.entries(), applied=True)
        try:
            await durable
        except BaseException:
            # Not durable, so not handed out: give the records back as they were.
            now = now_ms()
            for off, (attempts, old_grant, old_until, leased) in before.items():
                cur = work.deliveries.get(off)
                if cur is not None and cur.grant == grant:
                    work.put(off, leased, old_until, attempts, old_grant, cur.reason, now)
            raise
        if not chosen:
            return []
        records = {off: seen[off] for off in chosen if off in seen}
        if len(records) < len(chosen):
            records.update((r.offset, r) for r in await self.queues.resolve(
                state.partition, [off for off in chosen if off not in seen]))
        out = []
        for off in chosen:
            rec = records.get(off)
            if rec is not None:  # gone only if retention removed it meanwhile
                attempt = before[off][0] + 1
                out.append(LeasedRecord(rec, token(off, attempt, grant), attempt, until))
        return out

    async def dead_letter_expired(self, state: PartitionState, queue: str, consumer: str
                                  ) -> int:
        """Send the consumer's records whose last attempt expired to the dead letters now;
        returns how many went."""
        async with self._locks.hold(("c", queue, consumer)):
            work = state.work.get((queue, consumer))
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

    async def complete(self, queue: str, consumer: str, tokens: list[str]) -> SettleResult:
        """Finish the leased records for good (idempotent for records already done)."""
        p = self.queues.partition_of(queue)
        async with self._locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            work, act, already = settlement.check_tokens(state, queue, consumer, tokens, True)
            durable = None
            if act:
                write = WindowWrite(state, queue, consumer, work)
                write.finish([o for _, o in act])
                durable = self.queues.submit_entries(state, write.entries(), applied=True)
        if durable is not None:
            await durable
        self.metrics.records_completed.inc(len(act))
        state.wake(queue)  # the window moved, a key is free: leasers may go on
        return SettleResult(queue, consumer, [t for t, _ in act] + already, [],
                            state.committed(queue, consumer) or 0)

    async def retry(self, queue: str, consumer: str, tokens: list[str], delay_ms: int,
                    reason: str | None) -> SettleResult:
        """Give leased records back, available again after `delay_ms`; a record that used up
        its attempts goes to the dead letters instead."""
        hi = self.settings.max_retry_delay_ms
        if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or \
                not 0 <= delay_ms <= hi:
            raise BadRequest("limit_out_of_range", f"delay_ms must be an integer between 0 and "
                             f"{hi}", parameter="delay_ms", min=0, max=hi)
        if reason is not None and not isinstance(reason, str):
            raise BadRequest("invalid_parameter", "reason must be a string")
        reason = reason[:MAX_REASON_CHARS] if reason else None
        p = self.queues.partition_of(queue)
        async with self._locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            work, act, _ = settlement.check_tokens(state, queue, consumer, tokens, False)
            config = self.configs.of(state, queue, consumer)
            until = now_ms() + delay_ms
            write = WindowWrite(state, queue, consumer, work)
            dead: dict[int, str] = {}
            dead_tokens = []
            retried = 0
            for text, off in act:
                d = work.deliveries[off]
                if d.attempts >= config.max_attempts:
                    dead[off] = reason or "retried"
                    dead_tokens.append(text)
                else:
                    write.put(off, False, until, d.attempts, d.grant, reason)
                    retried += 1
            durable = (self.queues.submit_entries(state, write.entries(), applied=True)
                       if write else None)
            if dead:
                await self.dead_letters.send(state, queue, consumer, config, dead)
        if durable is not None:
            await durable
        self.metrics.records_retried.inc(retried)
        state.wake(queue)
        return SettleResult(queue, consumer, [t for t, _ in act], dead_tokens,
                            state.committed(queue, consumer) or 0)

    async def extend(self, queue: str, consumer: str, tokens: list[str], visibility_ms: int
                     ) -> SettleResult:
        """Move the leases' deadline to now + `visibility_ms`."""
        self.check_visibility(visibility_ms)
        p = self.queues.partition_of(queue)
        async with self._locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            work, act, _ = settlement.check_tokens(state, queue, consumer, tokens, False)
            until = now_ms() + visibility_ms
            write = WindowWrite(state, queue, consumer, work)
            for _, off in act:
                d = work.deliveries[off]
                write.put(off, True, until, d.attempts, d.grant, d.reason)
            durable = self.queues.submit_entries(state, write.entries(), applied=True)
        await durable
        return SettleResult(queue, consumer, [t for t, _ in act], [],
                            state.committed(queue, consumer) or 0, until)
