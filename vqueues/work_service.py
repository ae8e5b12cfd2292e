"""The work-queue rules: lease, complete, retry, extend, dead letters and consumer settings, on
the same queues as the cursors (docs/work-queues.md, ADR 8).

Every change is an offset-topic entry. A call takes the consumer's lock, decides, applies its
entries to the partition state at once and hands them to the producer in that order
(`QueueService.submit_entries`), releases the lock, and answers once they are durable: workers
see each other's leases at once, and a failover replays exactly what was answered.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence

from vqueues.errors import BadRequest, Conflict, NotFound
from vqueues.leases import (
    CURSOR,
    LEASE,
    ORDER_KEY_HEADER,
    ConsumerConfig,
    Delivery,
    WorkState,
    parse_token,
    token,
)
from vqueues.names import validate_name
from vqueues.partition_state import PartitionState
from vqueues.records import (
    ConsumerAcked,
    ConsumerConfigured,
    DeliveryCleared,
    DeliveryUpdated,
    OffsetEntry,
    Record,
    now_ms,
)
from vqueues.results import ConsumerSettings, LeasedRecord, LeaseResult, SettleResult
from vqueues.service import QueueService
from vqueues.settings import MIN_VISIBILITY_MS, Settings
from vqueues.tags import tags_of

MAX_REASON_CHARS = 1000
MAX_ATTEMPTS_LIMIT = 1000
# A dead-lettering in progress holds its records this long (in memory only: a crash redoes it).
DEAD_LETTER_HOLD_MS = 60_000


def _order_key(rec: Record) -> str | None:
    for name, value in rec.headers:
        if name == ORDER_KEY_HEADER and value is not None:
            return value.decode("utf-8", "replace")
    return None


class WorkService:
    def __init__(self, settings: Settings, queues: QueueService) -> None:
        self.settings = settings
        self.queues = queues
        self.ownership = queues.ownership
        self.metrics = queues.metrics
        self._locks = queues.locks

    # Settings ----------------------------------------------------------------------------------

    def _defaults(self) -> ConsumerConfig:
        s = self.settings
        return ConsumerConfig(LEASE, s.default_max_attempts, None, s.default_visibility_ms)

    def check_visibility(self, visibility_ms: int, name: str = "visibility_ms") -> int:
        hi = self.settings.max_visibility_ms
        if isinstance(visibility_ms, bool) or not isinstance(visibility_ms, int) or \
                not MIN_VISIBILITY_MS <= visibility_ms <= hi:
            raise BadRequest("limit_out_of_range", f"{name} must be an integer between "
                             f"{MIN_VISIBILITY_MS} and {hi}", parameter=name,
                             min=MIN_VISIBILITY_MS, max=hi)
        return visibility_ms

    async def configure(self, queue: str, consumer: str, mode: str | None,
                        max_attempts: int | None, dead_letter_queue: str | bool | None,
                        visibility_ms: int | None) -> ConsumerSettings:
        """Set a consumer's settings (absent ones keep their value, or the defaults).
        `dead_letter_queue` False means "not given"; None clears it."""
        if mode is not None and mode not in (CURSOR, LEASE):
            raise BadRequest("invalid_parameter", "mode must be cursor or lease")
        if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(
                max_attempts, int) or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT):
            raise BadRequest("limit_out_of_range", "max_attempts must be an integer between 1 "
                             f"and {MAX_ATTEMPTS_LIMIT}", parameter="max_attempts", min=1,
                             max=MAX_ATTEMPTS_LIMIT)
        if visibility_ms is not None:
            self.check_visibility(visibility_ms)
        if isinstance(dead_letter_queue, str):
            validate_name(dead_letter_queue, "dead_letter_queue")
            if dead_letter_queue == queue:
                raise BadRequest("invalid_parameter",
                                 "a queue cannot be its own dead-letter queue")
        p = self.queues.partition_of(queue)
        async with self._locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            old = state.configs.get((queue, consumer))
            if old is None:
                old = self._defaults()
                if mode is None and state.committed(queue, consumer) is not None:
                    old = ConsumerConfig(CURSOR, old.max_attempts, None, old.visibility_ms)
            new = ConsumerConfig(
                mode or old.mode,
                old.max_attempts if max_attempts is None else max_attempts,
                old.dead_letter_queue if dead_letter_queue is False else
                (dead_letter_queue if isinstance(dead_letter_queue, str) else None),
                old.visibility_ms if visibility_ms is None else visibility_ms)
            entries: list[OffsetEntry] = []
            committed = state.committed(queue, consumer)
            if committed is None:
                committed = state.first_offset(queue)
                entries.append(ConsumerAcked(queue, consumer, committed, now_ms()))
            if new.mode == CURSOR:
                entries += state.window_tombstones(queue, consumer)
            entries.append(ConsumerConfigured(queue, consumer, new.mode, new.max_attempts,
                                              new.dead_letter_queue, new.visibility_ms))
            await self.queues.write_entries(state, entries)
        return ConsumerSettings(queue, consumer, new.mode, new.max_attempts,
                                new.dead_letter_queue, new.visibility_ms, committed)

    def consumer_settings(self, queue: str, consumer: str) -> ConsumerSettings:
        state = self.ownership.require(self.queues.partition_of(queue))
        committed = state.committed(queue, consumer)
        config = state.configs.get((queue, consumer))
        if config is None:
            if committed is None:
                raise NotFound("consumer_not_found",
                               f"queue {queue!r} has no consumer {consumer!r}")
            d = self._defaults()
            config = ConsumerConfig(CURSOR, d.max_attempts, None, d.visibility_ms)
        return ConsumerSettings(queue, consumer, config.mode, config.max_attempts,
                                config.dead_letter_queue, config.visibility_ms, committed)

    @staticmethod
    def _offsets(state: PartitionState, queue: str) -> array[int]:
        q = state.queues.get(queue)
        return q.offsets if q is not None else array("q")

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
            work, config = await self._lease_consumer(state, queue, consumer)
            visibility = visibility_ms or config.visibility_ms
            await self._learn_keys(state, queue, consumer, work)
            exhausted = self._exhausted(state, queue, consumer, work, config)
            if exhausted:
                await self._dead_letter(state, queue, consumer, config,
                                        {o: "lease expired" for o in exhausted})
            chosen, skipped = await self._choose(state, queue, consumer, work, max_records, tag)
            if state.revoked:
                return []
            entries: list[OffsetEntry] = []
            if skipped:
                entries += self._settle(state, queue, consumer, work, skipped)
            if not chosen:
                if entries:  # only skipped records: their completion is the progress made
                    await self.queues.submit_entries(state, entries)
                return []
            now = now_ms()
            until = now + visibility
            for off in chosen:
                d = work.deliveries[off]
                entries.append(DeliveryUpdated(queue, consumer, off, d.attempts + 1, until,
                                               True, False, d.order_key, d.reason))
            durable = self.queues.submit_entries(state, entries)
        try:
            await durable
        except BaseException:
            # Not durable, so not handed out: give the records back as they were.
            for e in entries:
                if not isinstance(e, DeliveryUpdated) or not e.leased:
                    continue
                cur = work.deliveries.get(e.offset)
                if cur is not None and cur.attempts == e.attempts:
                    cur.attempts -= 1
                    cur.until = 0
                    cur.leased = False
            raise
        records = {r.offset: r for r in await self.queues.resolve(state.partition, chosen)}
        out = []
        for e in entries:
            if not isinstance(e, DeliveryUpdated) or not e.leased:
                continue
            rec = records.get(e.offset)
            if rec is not None:  # gone only if retention removed it meanwhile
                out.append(LeasedRecord(rec, token(e.offset, e.attempts), e.attempts, until))
        return out

    async def _lease_consumer(self, state: PartitionState, queue: str, consumer: str
                              ) -> tuple[WorkState, ConsumerConfig]:
        """The consumer's window and settings; a first lease makes it a lease consumer that
        starts at its committed offset, or at the queue's first retained record."""
        config = state.configs.get((queue, consumer))
        if config is not None and config.mode != LEASE:
            raise Conflict("consumer_mode_mismatch", f"consumer {consumer!r} is a cursor "
                           "consumer: read and ack, or set its mode to lease", mode=config.mode)
        if config is None:
            config = self._defaults()
            entries: list[OffsetEntry] = []
            if state.committed(queue, consumer) is None:
                entries.append(ConsumerAcked(queue, consumer, state.first_offset(queue),
                                             now_ms()))
            entries.append(ConsumerConfigured(queue, consumer, LEASE, config.max_attempts, None,
                                              config.visibility_ms))
            await self.queues.write_entries(state, entries)
        work = state.work.get((queue, consumer))
        if work is None:  # revoked meanwhile (the write was not applied)
            self.ownership.require(state.partition)
            raise Conflict("consumer_mode_mismatch", "the consumer changed meanwhile; retry")
        return work, config

    def _window(self, state: PartitionState, queue: str, consumer: str, work: WorkState
                ) -> tuple[array[int], int]:
        committed = state.committed(queue, consumer) or 0
        return work.window(self._offsets(state, queue), committed), committed

    async def _learn_keys(self, state: PartitionState, queue: str, consumer: str,
                          work: WorkState) -> None:
        """Window records never delivered (skipped for their key before a failover) get a
        Delivery with their ordering key, read from the records."""
        window, _ = self._window(state, queue, consumer, work)
        unknown = [o for o in window if o not in work.deliveries and o not in work.done]
        if unknown:
            for rec in await self.queues.resolve(state.partition, unknown):
                work.deliveries.setdefault(rec.offset, Delivery(0, 0, False, _order_key(rec)))
            for off in unknown:  # gone (retention): nothing to deliver
                work.deliveries.setdefault(off, Delivery(0, 0, False, None))

    def _exhausted(self, state: PartitionState, queue: str, consumer: str, work: WorkState,
                   config: ConsumerConfig) -> list[int]:
        """Available records that used up their attempts (their last lease expired)."""
        now = now_ms()
        window, _ = self._window(state, queue, consumer, work)
        out = []
        for off in window:
            d = work.deliveries.get(off)
            if d is not None and d.attempts >= config.max_attempts and d.available(now):
                out.append(off)
        return out

    async def _choose(self, state: PartitionState, queue: str, consumer: str, work: WorkState,
                      max_records: int, tag: str | None = None) -> tuple[list[int], list[int]]:
        """The offsets to lease, in offset order: first the window's available records, then
        new ones (each joins the window); a record waits while an earlier record with its
        ordering key is not done. Also the new records `tag` filters out (to complete)."""
        now = now_ms()
        busy: set[str] = set()
        chosen: list[int] = []
        window, committed = self._window(state, queue, consumer, work)
        for off in window:
            if off in work.done:
                continue
            d = work.deliveries[off]
            key = d.order_key
            if not d.available(now) or (key is not None and key in busy):
                if key is not None:
                    busy.add(key)
                continue
            chosen.append(off)
            if key is not None:
                busy.add(key)
            if len(chosen) >= max_records:
                return chosen, []
        skipped: list[int] = []
        room = self.settings.max_lease_window - len(window)
        while len(chosen) < max_records and room > 0:
            ahead = state.select(queue, max(work.frontier, committed),
                                 min(room, max(16, 2 * (max_records - len(chosen)))))
            if not ahead:
                break
            records = {r.offset: r for r in await self.queues.resolve(state.partition, ahead)}
            if state.revoked:
                return [], []
            for off in ahead:
                if off < work.frontier:  # another call took it meanwhile
                    continue
                rec = records.get(off)
                key = _order_key(rec) if rec is not None else None
                work.deliveries[off] = Delivery(0, 0, False, key)
                work.frontier = off + 1
                room -= 1
                if tag is not None and (rec is None or tag not in tags_of(rec.headers)):
                    skipped.append(off)  # not for this consumer's filter: done as skipped
                    continue
                if rec is not None and len(chosen) < max_records and (
                        key is None or key not in busy):
                    chosen.append(off)
                if key is not None:
                    busy.add(key)
                if len(chosen) >= max_records or room <= 0:
                    break
        return chosen, skipped

    # Settling ----------------------------------------------------------------------------------

    def _settle(self, state: PartitionState, queue: str, consumer: str, work: WorkState,
                offsets: Sequence[int], dead: int = 0) -> list[OffsetEntry]:
        """Entries that mark `offsets` done and move the low-water mark as far as it goes:
        the committed offset first, then tombstones for what fell below it (a crash between
        them leaves entries below the mark, which replay ignores)."""
        queue_offsets = self._offsets(state, queue)
        committed = state.committed(queue, consumer) or 0
        for off in offsets:
            work.deliveries.pop(off, None)
            work.done.add(off, queue_offsets)
        low = work.low_water(queue_offsets, committed)
        entries: list[OffsetEntry] = []
        if low > committed or dead:
            entries.append(ConsumerAcked(queue, consumer, low, now_ms(),
                                         work.dead_lettered + dead))
        below = [o for o in work.window(queue_offsets, committed) if o < low]
        below += [o for o in offsets if o < low and o not in below]
        entries += [DeliveryCleared(queue, consumer, o) for o in sorted(set(below))]
        entries += [DeliveryUpdated(queue, consumer, o, 0, 0, False, True)
                    for o in offsets if o >= low]
        return entries

    def _check_tokens(self, state: PartitionState, queue: str, consumer: str,
                      tokens: Sequence[str], done_ok: bool
                      ) -> tuple[WorkState, list[tuple[str, int]], list[str]]:
        """(window, [(token, offset)] to act on, tokens already done); 409 if any is stale."""
        work = state.work.get((queue, consumer))
        if work is None:
            config = state.configs.get((queue, consumer))
            if config is not None and config.mode != LEASE:
                raise Conflict("consumer_mode_mismatch",
                               f"consumer {consumer!r} is a cursor consumer")
            raise Conflict("lease_expired", f"consumer {consumer!r} holds no lease",
                           stale=list(tokens))
        committed = state.committed(queue, consumer) or 0
        act: list[tuple[str, int]] = []
        already: list[str] = []
        stale: list[str] = []
        for text in tokens:
            parsed = parse_token(text)
            assert parsed is not None  # checked by the caller
            off, attempt = parsed
            d = work.deliveries.get(off)
            if off < committed or off in work.done:
                (already if done_ok else stale).append(text)
            elif d is not None and d.attempts == attempt and attempt > 0:
                act.append((text, off))
            else:
                stale.append(text)
        if stale:
            raise Conflict("lease_expired", f"{len(stale)} token(s) are not current: the lease "
                           "expired and the record was leased again, was completed, or never "
                           "existed", stale=stale)
        return work, act, already

    @staticmethod
    def parse_tokens(tokens: object) -> list[str]:
        """A request's `tokens`, checked (400 invalid_token)."""
        if isinstance(tokens, str):
            tokens = [tokens]
        if not isinstance(tokens, list) or not tokens:
            raise BadRequest("invalid_token", "`tokens` must be a non-empty list of lease tokens")
        bad = [t for t in tokens if parse_token(t) is None]
        if bad:
            raise BadRequest("invalid_token", f"not lease tokens: {bad[:5]}", invalid=bad[:50])
        return list(dict.fromkeys(tokens))

    async def complete(self, queue: str, consumer: str, tokens: list[str]) -> SettleResult:
        """Finish the leased records for good (idempotent for records already done)."""
        p = self.queues.partition_of(queue)
        async with self._locks.hold(("c", queue, consumer)):
            state = self.ownership.require(p)
            work, act, already = self._check_tokens(state, queue, consumer, tokens, True)
            entries = self._settle(state, queue, consumer, work, [o for _, o in act])
            durable = self.queues.submit_entries(state, entries) if entries else None
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
            work, act, _ = self._check_tokens(state, queue, consumer, tokens, False)
            config = state.configs.get((queue, consumer)) or self._defaults()
            until = now_ms() + delay_ms
            entries: list[OffsetEntry] = []
            dead: dict[int, str] = {}
            dead_tokens = []
            for text, off in act:
                d = work.deliveries[off]
                if d.attempts >= config.max_attempts:
                    dead[off] = reason or "retried"
                    dead_tokens.append(text)
                else:
                    entries.append(DeliveryUpdated(queue, consumer, off, d.attempts, until,
                                                   False, False, d.order_key, reason))
            durable = self.queues.submit_entries(state, entries) if entries else None
            if dead:
                await self._dead_letter(state, queue, consumer, config, dead)
        if durable is not None:
            await durable
        self.metrics.records_retried.inc(len(entries))
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
            work, act, _ = self._check_tokens(state, queue, consumer, tokens, False)
            until = now_ms() + visibility_ms
            entries: list[OffsetEntry] = []
            for _, off in act:
                d = work.deliveries[off]
                entries.append(DeliveryUpdated(queue, consumer, off, d.attempts, until, True,
                                               False, d.order_key, d.reason))
            durable = self.queues.submit_entries(state, entries)
        await durable
        return SettleResult(queue, consumer, [t for t, _ in act], [],
                            state.committed(queue, consumer) or 0, until)

    # Dead letters ------------------------------------------------------------------------------

    async def _dead_letter(self, state: PartitionState, queue: str, consumer: str,
                           config: ConsumerConfig, reasons: dict[int, str]) -> None:
        """Write the records to the dead-letter queue (through the producer, wherever its
        partition is owned), then complete them here, counted. Called under the consumer's
        lock. A crash in between writes them again on the next try: at least once."""
        work = state.work[(queue, consumer)]
        offsets = sorted(reasons)
        hold = now_ms() + DEAD_LETTER_HOLD_MS
        for off in offsets:  # nobody leases them meanwhile
            d = work.deliveries.get(off)
            if d is not None:
                d.until, d.leased = hold, True
        records = await self.queues.resolve(state.partition, offsets)
        dlq = config.dead_letter_queue
        if dlq and records:
            attempts = {o: work.deliveries[o].attempts for o in offsets if o in work.deliveries}
            out = []
            for rec in records:
                headers = [(k, v) for k, v in rec.headers if v is not None]
                headers += [("vq-dlq-source-queue", queue.encode()),
                            ("vq-dlq-source-offset", str(rec.offset).encode()),
                            ("vq-dlq-consumer", consumer.encode()),
                            ("vq-dlq-attempts", str(attempts.get(rec.offset, 0)).encode()),
                            ("vq-dlq-reason", reasons[rec.offset].encode())]
                out.append((rec.value, headers))
            target = self.ownership.states.get(self.queues.partition_of(dlq))
            await self.queues.append_records(
                dlq, out, target if target is not None and target.ready.is_set() else None)
        entries = self._settle(state, queue, consumer, work, offsets, dead=len(offsets))
        await self.queues.submit_entries(state, entries)
        self.metrics.records_dead_lettered.inc(len(offsets))
