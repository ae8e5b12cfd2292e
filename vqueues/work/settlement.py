"""Settling leased records: which tokens are current (docs/work-queues.md). A token names one
delivery: the record, its attempt and the lease call that granted it (ADR 12), so a token of
a grant that was lost or fenced off is never current, on this owner or the next."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from vqueues.errors import BadRequest, Conflict
from vqueues.state.consumer_config import LEASE
from vqueues.state.partition_state import PartitionState
from vqueues.state.tokens import parse_token
from vqueues.state.window import LeaseWindow


def parse_tokens(tokens: object) -> list[str]:
    """A request's `tokens`, checked (400 invalid_token), repeats dropped."""
    if not isinstance(tokens, list) or not tokens:
        raise BadRequest("invalid_token", "`tokens` must be a non-empty list of lease tokens")
    parsed: dict[str, tuple[int, int, int]] = {}
    bad = []
    for t in tokens:
        got = parse_token(t)
        if got is None:
            bad.append(t)
        else:
            parsed[t] = got
    if bad:
        raise BadRequest("invalid_token", f"not lease tokens: {bad[:5]}", invalid=bad[:50])
    return Tokens(parsed)


class Tokens(list[str]):
    """Checked tokens, in order without repeats, with what each names (parsed once)."""

    def __init__(self, parsed: dict[str, tuple[int, int, int]]) -> None:
        super().__init__(parsed)
        self.parsed = parsed


# A check's result: (window, [(token, offset)] to act on, tokens already done).
Checked = tuple[LeaseWindow, list[tuple[str, int]], list[str]]


def check_tokens(state: PartitionState, queue: str, consumer: str, tokens: Sequence[str],
                 done_ok: bool, stale_out: list[str] | None = None) -> Checked:
    """(window, [(token, offset)] to act on, tokens already done); 409 if any is stale, unless
    `stale_out` is given: the stale ones are put there instead (a lease's completions).
    A done record's token counts as done only if the record's last delivery could have been
    that one; a record completed since is `already` for a complete (idempotent)."""
    work = state.windows.get((queue, consumer))
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
    deliveries, done = work.deliveries, work.done
    known = tokens.parsed if isinstance(tokens, Tokens) else {}
    for text in tokens:
        parsed = known.get(text) or parse_token(text)
        assert parsed is not None  # checked by the caller
        off, attempt, grant = parsed
        d = deliveries.get(off)
        if d is not None:
            if d.attempts == attempt and d.grant == grant and attempt > 0:
                act.append((text, off))
            else:
                stale.append(text)
        elif (off < committed or off in done) and _may_be_record(state, queue, off):
            (already if done_ok else stale).append(text)
        else:
            stale.append(text)
    if stale_out is not None:
        stale_out += stale
    elif stale:
        raise Conflict("lease_expired", f"{len(stale)} token(s) are not current: the lease "
                       "expired and the record was leased again, was completed, or never "
                       "existed", stale=stale)
    return work, act, already


def _may_be_record(state: PartitionState, queue: str, offset: int) -> bool:
    """Whether `offset` may be one of the queue's records: a token naming another queue's
    record, or no record, never existed here. Below the queue's retained records (retention,
    a deletion) it cannot be told: such a token counts as done."""
    q = state.queues.get(queue)
    if q is None or offset < max(state.log_start, q.deleted_before):
        return True
    i = bisect_left(q, offset)
    return i < len(q) and q[i] == offset
