"""The keyed enqueue: records with idempotency keys, written once per key within the window
(docs/api.md, "Idempotent enqueue"; ADR 9)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Sequence
from typing import Protocol

from vqueues.errors import Conflict, Unavailable, VQError
from vqueues.locks import Claims
from vqueues.ownership.ownership import Ownership
from vqueues.queues.record_reader import RecordReader
from vqueues.records import NewRecord, now_ms
from vqueues.results import EnqueueResult
from vqueues.settings import Settings
from vqueues.state.idempotency import IdempotencyWindow, fingerprints, payload_of
from vqueues.state.partition_state import PartitionState

# How often held keys are looked for again (while the tail is idle, or the partition has no
# ready state here).
HOLD_POLL_S = 0.2

# `KeyedEnqueue._check`: offsets found, key -> (first index, payload), records to write, a
# claim held elsewhere.
_Checked = tuple[list[int | None], dict[bytes, tuple[int, int]], list[int],
                 asyncio.Future[None] | None]

class Writer(Protocol):
    """What the keyed enqueue needs of the queue service (`service.QueueService`)."""

    settings: Settings
    ownership: Ownership

    def partition_of(self, queue: str) -> int: ...

    async def append_records(self, queue: str, records: Sequence[NewRecord],
                             state: PartitionState | None = None,
                             known: Sequence[tuple[int, int] | None] | None = None
                             ) -> EnqueueResult: ...

    @property
    def reader(self) -> RecordReader: ...


class KeyedEnqueue:
    """The idempotency keys being written (`Claims`), and the enqueue that checks them."""

    def __init__(self, service: Writer) -> None:
        self._service = service
        self._claims = Claims()
        self._settling: set[asyncio.Task[None]] = set()

    async def enqueue(self, queue: str, records: Sequence[NewRecord],
                      keys: list[bytes | None], places: Sequence[int] | None = None
                      ) -> EnqueueResult:
        """Enqueue records some of which carry idempotency keys: a key already in the window
        answers its first offset and writes nothing; its payload must match, and a key repeated
        in the request must repeat its payload (409 otherwise, and nothing is written). The
        keys are claimed (`Claims`) from the check to the indexing of the write, so two
        requests with one key never both write: the later one waits and looks again.
        `places`: each record's index in the request, when the request held other queues'
        records too (a 409 names the records by it)."""
        at = places if places is not None else range(len(records))
        service = self._service
        p = service.partition_of(queue)
        fps = fingerprints(queue, [k for k in keys if k is not None])
        while True:
            state = service.ownership.require(p)
            offsets, first_in_batch, todo, busy = self._check(state, p, fps, keys, records,
                                                                at)
            if busy is None:
                break
            # Another call is writing one of these keys: once it is done, look again (its
            # record is then in the window, or it failed and this call writes the key).
            # Bounded: keys of a write in doubt or unindexed may be held longer than a
            # client waits for an answer.
            budget = service.settings.broker_timeout_ms / 1000
            if not (await asyncio.wait([busy], timeout=budget))[0]:
                raise Unavailable("broker_timeout", "an earlier write of one of these "
                                  "idempotency keys is not settled yet (not known to be "
                                  "stored, or stored and not read back); send it again")
        claimed = [(p, fps[k]) for k in first_in_batch]
        done = self._claims.claim(claimed)
        release = True
        try:
            if todo:
                known = [(fps[k], first_in_batch[k][1]) if (k := keys[i]) is not None
                         else None for i in todo]
                try:
                    written = await service.append_records(queue, [records[i] for i in todo],
                                                           state, known)
                except Unavailable:
                    # A failed write may be stored all the same (the broker took it, then its
                    # answer was lost or came too late): find out before the keys are free,
                    # or the retry that follows stores them twice.
                    keyed = [(i, fps[k]) for i in todo if (k := keys[i]) is not None]
                    if not keyed:
                        raise  # no key: a retry may store them twice, as documented
                    if not await self._look_again(state, keyed, offsets):
                        release = False  # in doubt: held until told (`_resolve_doubt`)
                        self._in_background(self._resolve_doubt(p, keyed, claimed, done))
                        raise
                    if any(offsets[i] is None for i, _ in keyed):
                        raise  # not stored: a retry writes them
                    written = EnqueueResult(p, None)  # stored after all: answered as such
                if written.offsets is None:
                    # Stored, offsets unreported (a batch resent after a lost connection):
                    # the keys stay claimed until the tail has indexed them, so a retry
                    # finds them instead of writing them again, also when that takes
                    # longer than this request waits (the tail may be reconnecting too).
                    keyed = [(i, fps[k]) for i in todo if (k := keys[i]) is not None]
                    if not await self._until_known(state, keyed, offsets):
                        release = False
                        self._in_background(self._hold_until_indexed(p, keyed, claimed, done))
                        raise Unavailable("broker_timeout", "the write was stored, but its "
                                          "records were not indexed in time; send it again")
                else:
                    for i, off in zip(todo, written.offsets, strict=True):
                        offsets[i] = off
        finally:
            if release:
                self._claims.release(claimed, done)
        return _answer(p, keys, offsets, first_in_batch)

    def _check(self, state: PartitionState, p: int, fps: dict[bytes, int],
               keys: list[bytes | None], records: Sequence[NewRecord], at: Sequence[int]
               ) -> _Checked:
        """The keys against the window and each other: the offsets of the keys already
        stored, each new key's first record (index, payload), the records to write, and a
        claim another call holds on one of the new keys (None if none)."""
        window = state.idempotency
        window.expire(now_ms())
        offsets: list[int | None] = [None] * len(records)
        first_in_batch: dict[bytes, tuple[int, int]] = {}  # key -> (index, payload)
        todo: list[int] = []
        busy: asyncio.Future[None] | None = None
        for i, (key, (value, headers)) in enumerate(zip(keys, records, strict=True)):
            if key is None:
                todo.append(i)
                continue
            payload = payload_of(value, headers)
            seen = window.lookup(fps[key])
            if seen is not None:
                if seen.payload != payload:
                    raise Conflict("idempotency_key_reused",
                                   f"records[{at[i]}]: idempotency key seen at offset "
                                   f"{seen.offset} with another payload",
                                   first_offset=seen.offset, index=at[i])
                offsets[i] = seen.offset
            elif key in first_in_batch:
                first, first_payload = first_in_batch[key]
                if payload != first_payload:
                    raise Conflict("idempotency_key_reused",
                                   f"records[{at[i]}]: idempotency key already given to "
                                   f"records[{at[first]}] of this request with another "
                                   "payload", first_offset=None, first_index=at[first],
                                   index=at[i])
                # the same as an earlier record of this request: filled below
            else:
                busy = busy or self._claims.holder((p, fps[key]))
                first_in_batch[key] = (i, payload)
                todo.append(i)
        return offsets, first_in_batch, todo, busy

    def _in_background(self, settling: Coroutine[None, None, None]) -> None:
        """Run a task that holds keys and releases them when it ends."""
        task = asyncio.ensure_future(settling)
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)

    async def _look_again(self, state: PartitionState, keyed: list[tuple[int, int]],
                          offsets: list[int | None]) -> bool:
        """After a failed write: index the partition up to its end as the broker reports it
        now, then fill in the offsets of the write's keyed records (index, key fingerprint)
        found in the window. False if that cannot be done in `write_visible_timeout_ms` (the
        broker does not answer, the tail lags): then nobody can tell whether they are stored.
        On tansu the end may be reported low (ADR 3): a record stored past it is missed."""
        budget = self._service.settings.write_visible_timeout_ms / 1000
        started = time.monotonic()
        try:
            end = await asyncio.wait_for(self._service.reader.log_end(state.partition), budget)
        except (VQError, TimeoutError):
            return False
        remaining = budget - (time.monotonic() - started)
        if end > state.next_offset and (
                remaining <= 0 or not await state.wait_indexed(end - 1, remaining)):
            return False
        if state.revoked:
            return False
        _from_window(state.idempotency, keyed, offsets)
        return True

    async def _resolve_doubt(self, p: int, keyed: list[tuple[int, int]],
                      claimed: list[tuple[int, int]], done: asyncio.Future[None]) -> None:
        """Keys of a failed write that may be stored stay claimed (a retry waits for them)
        until partition `p`'s end, indexed by its state on this node (a new one, if it was
        revoked and assigned again meanwhile), says whether they are, or `broker_timeout_ms`
        passed (then a retry may write them again: at-least-once, as any write that timed
        out)."""
        deadline = time.monotonic() + self._service.settings.broker_timeout_ms / 1000
        try:
            offsets: list[int | None] = [None] * (max(i for i, _ in keyed) + 1)
            while time.monotonic() < deadline:
                try:
                    state = self._service.ownership.require(p)
                except VQError as exc:
                    if exc.code == "wrong_node":
                        return  # another node's now: it replays what was stored
                else:
                    if await self._look_again(state, keyed, offsets):
                        return
                await asyncio.sleep(HOLD_POLL_S)
        finally:
            self._claims.release(claimed, done)

    async def _until_known(self, state: PartitionState, keyed: list[tuple[int, int]],
                           offsets: list[int | None]) -> bool:
        """Wait until the tail has indexed the keyed records (index, key fingerprint) of a
        write whose offsets went unreported, and fill in their offsets from the window; False
        if it has not after `write_visible_timeout_ms`, or `state` was revoked."""
        deadline = time.monotonic() + self._service.settings.write_visible_timeout_ms / 1000
        while True:
            if _from_window(state.idempotency, keyed, offsets):
                return True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or state.revoked:
                return False
            await state.wait_indexed(state.next_offset, remaining)

    async def _hold_until_indexed(self, p: int, keyed: list[tuple[int, int]],
                                  claimed: list[tuple[int, int]], done: asyncio.Future[None]
                                  ) -> None:
        """Keys of a write known to be stored stay claimed until partition `p`'s state on
        this node (a new one, if it was revoked and assigned again: its replay indexes them)
        holds them, or the partition is another node's (whose replay does): never released
        while a retry could store them again."""
        offsets: list[int | None] = [None] * (max(i for i, _ in keyed) + 1)
        try:
            while True:
                try:
                    state = self._service.ownership.require(p)
                except VQError as exc:
                    if exc.code == "wrong_node":
                        return
                    await asyncio.sleep(HOLD_POLL_S)
                    continue
                if _from_window(state.idempotency, keyed, offsets):
                    return
                if state.revoked:  # being handed over: its successor replays them
                    await asyncio.sleep(HOLD_POLL_S)
                else:
                    await state.wait_indexed(state.next_offset, HOLD_POLL_S)
        finally:
            self._claims.release(claimed, done)


def _from_window(window: IdempotencyWindow, keyed: list[tuple[int, int]],
                 offsets: list[int | None]) -> bool:
    """Fill in the offsets of the keyed records (index, key fingerprint) that `window` holds;
    True if it holds them all."""
    found = True
    for i, fp in keyed:
        seen = window.lookup(fp)
        if seen is None:
            found = False
        else:
            offsets[i] = seen.offset
    return found


def _answer(p: int, keys: list[bytes | None], offsets: list[int | None],
            first_in_batch: dict[bytes, tuple[int, int]]) -> EnqueueResult:
    """The result: a key repeated in the request answers its first record's offset."""
    for i, key in enumerate(keys):
        if offsets[i] is None and key is not None:
            offsets[i] = offsets[first_in_batch[key][0]]
    if any(o is None for o in offsets):  # records without keys whose offsets are unknown
        return EnqueueResult(p, None)
    return EnqueueResult(p, [int(o) for o in offsets if o is not None])
