"""Settling leased records: which tokens are current, and the offset-topic entries that mark
records done and move the low-water mark (docs/work-queues.md, ADR 8). Decisions on the
partition's state, made under the consumer's lock; the work service writes what they return."""

from __future__ import annotations

from collections.abc import Sequence

from vqueues.errors import BadRequest, Conflict
from vqueues.lease_choice import queue_offsets
from vqueues.leases import LEASE, WorkState, parse_token
from vqueues.partition_state import PartitionState
from vqueues.records import (
    ConsumerAcked,
    DeliveryCleared,
    DeliveryUpdated,
    OffsetEntry,
    now_ms,
)


def parse_tokens(tokens: object) -> list[str]:
    """A request's `tokens`, checked (400 invalid_token), repeats dropped."""
    if isinstance(tokens, str):
        tokens = [tokens]
    if not isinstance(tokens, list) or not tokens:
        raise BadRequest("invalid_token", "`tokens` must be a non-empty list of lease tokens")
    bad = [t for t in tokens if parse_token(t) is None]
    if bad:
        raise BadRequest("invalid_token", f"not lease tokens: {bad[:5]}", invalid=bad[:50])
    return list(dict.fromkeys(tokens))


def check_tokens(state: PartitionState, queue: str, consumer: str, tokens: Sequence[str],
                 done_ok: bool) -> tuple[WorkState, list[tuple[str, int]], list[str]]:
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


def settle(state: PartitionState, queue: str, consumer: str, work: WorkState,
           offsets: Sequence[int], dead: int = 0) -> list[OffsetEntry]:
    """Entries that mark `offsets` done and move the low-water mark as far as it goes: the
    committed offset first, then tombstones for what fell below it (a crash between them
    leaves entries below the mark, which replay ignores). `dead` of them were dead-lettered."""
    held = queue_offsets(state, queue)
    committed = state.committed(queue, consumer) or 0
    for off in offsets:
        work.deliveries.pop(off, None)
        work.done.add(off, held)
    low = work.low_water(held, committed)
    entries: list[OffsetEntry] = []
    if low > committed or dead:
        entries.append(ConsumerAcked(queue, consumer, low, now_ms(),
                                     work.dead_lettered + dead))
    below = [o for o in work.window(held, committed) if o < low]
    below += [o for o in offsets if o < low and o not in below]
    entries += [DeliveryCleared(queue, consumer, o) for o in sorted(set(below))]
    entries += [DeliveryUpdated(queue, consumer, o, 0, 0, False, True)
                for o in offsets if o >= low]
    return entries
