"""Forwarding late records (ADR 19): a record that reaches an old layout's data partition after
its cut (a plain Kafka producer still writing the old topic, a zombie node's enqueue) is not
in the parent's final snapshot. The child its queue routes to now enqueues a copy, in the
parent partition's order, with an idempotency key naming the original, and keeps its place as
a committed offset: a copy repeated after a crash is stored once (within the idempotency
window)."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from vqueues.errors import VQError
from vqueues.hashing import partition_for
from vqueues.layouts import FORWARDED_HEADER, kafka_offset
from vqueues.ownership.adoption import Adoption
from vqueues.ownership.ownership import Ownership
from vqueues.queues.service import QueueService
from vqueues.records import NewRecord
from vqueues.state.idempotency import KEY_HEADER, key_of
from vqueues.state.partition_state import PartitionState
from vqueues.storage import Entry

log = logging.getLogger(__name__)

READ_BATCH = 500
READ_WAIT_S = 1.0
RETRY_S = 0.5  # after a retriable refusal (the partition not ready, the broker away)


class LateRecords(Protocol):
    """One old data partition read on from a committed place (`kafka.PartitionReader`)."""

    def start(self, default: int) -> int: ...
    def read(self, max_records: int, timeout_s: float) -> list[tuple[int, Entry]]: ...
    def commit(self, next_offset: int) -> None: ...
    def close(self) -> None: ...


class Forwarding:
    """Runs one forwarder per ready partition of the layout `adoption` describes.
    `open_reader(child)` opens the child's reader of its parent's data partition."""

    def __init__(self, ownership: Ownership, service: QueueService, adoption: Adoption,
                 open_reader: Callable[[int], LateRecords]) -> None:
        self.ownership = ownership
        self.service = service
        self.adoption = adoption
        self.open_reader = open_reader
        self.forwarded = 0
        self._stopping = False
        # By state, not partition number: a partition given back is a new state.
        self._tasks: dict[PartitionState, asyncio.Task[None]] = {}

    def start(self) -> None:
        self.ownership.on_ready.append(self._ready)
        for state in list(self.ownership.states.values()):
            if state.ready.is_set():
                self._ready(state)

    def _ready(self, state: PartitionState) -> None:
        running = self._tasks.get(state)
        if self._stopping or (running is not None and not running.done()):
            return
        for gone in [s for s, task in self._tasks.items() if task.done()]:
            del self._tasks[gone]
        self._tasks[state] = asyncio.get_running_loop().create_task(self._forward(state))

    async def close(self) -> None:
        """Stop every forwarder: each finishes the read it is in (at most READ_WAIT_S)."""
        self._stopping = True
        tasks = list(self._tasks.values())
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=READ_WAIT_S + 5)
            for task in late:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _forward(self, state: PartitionState) -> None:
        child = state.partition
        parent = self.adoption.layout.parent(child, self.adoption.parent)
        cut = self.adoption.cuts.get(parent)
        if cut is None:
            return
        loop = asyncio.get_running_loop()
        # One thread per reader: a consumer is used by one thread, calls in turn, its close
        # after its last read; and a reader polling for a second holds no shared pool thread.
        thread = ThreadPoolExecutor(1, thread_name_prefix=f"vq-forward-{child}")
        opening = loop.run_in_executor(thread, self.open_reader, child)
        try:
            reader = await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(lambda done: thread.submit(done.result().close)
                                      if done.exception() is None else None)
            thread.shutdown(wait=False)
            raise
        try:
            await loop.run_in_executor(thread, reader.start, kafka_offset(cut.marker) + 1)
            while not state.revoked and not self._stopping:
                batch = await loop.run_in_executor(thread, reader.read, READ_BATCH,
                                                   READ_WAIT_S)
                if not batch:
                    continue
                mine = self._copies(parent, child, batch)
                for queue, group in itertools.groupby(mine, key=lambda item: item[0]):
                    records = [record for _, record in group]
                    if not await self._enqueue(state, queue, records):
                        return  # revoked: the next owner forwards from the committed place
                await loop.run_in_executor(thread, reader.commit, batch[-1][0] + 1)
                if mine:
                    self.forwarded += len(mine)
                    log.info("late_records_forwarded", extra={
                        "partition": child, "parent": parent, "records": len(mine),
                        "next": batch[-1][0] + 1})
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("forwarding_failed", extra={"partition": child})
            await asyncio.sleep(RETRY_S)
            if not state.revoked and not self._stopping:
                self._tasks.pop(state, None)
                self._ready(state)
        finally:
            thread.submit(reader.close)  # after the read in flight, on the reader's thread
            thread.shutdown(wait=False)

    def _copies(self, parent: int, child: int, batch: list[tuple[int, Entry]]
                ) -> list[tuple[str, NewRecord]]:
        """The records of `batch` whose queues route to `child`, as copies to enqueue."""
        layout = self.adoption.parent.number
        out: list[tuple[str, NewRecord]] = []
        for offset, (key, value, headers) in batch:
            try:
                queue = key.decode("utf-8") if key else None
            except UnicodeDecodeError:
                queue = None
            if queue is None or partition_for(queue, self.adoption.layout.partitions) != child:
                continue
            kept = [(k, v) for k, v in headers or () if v is not None]
            origin = f"l{layout}/{parent}/{offset}"
            if key_of(kept) is None:
                kept.append((KEY_HEADER, f"vq-forwarded:{origin}".encode()))
            kept.append((FORWARDED_HEADER, origin.encode()))
            out.append((queue, (value, kept)))
        return out

    async def _enqueue(self, state: PartitionState, queue: str,
                       records: list[NewRecord]) -> bool:
        """Enqueue until it is written; False if the partition went away first."""
        while not state.revoked:
            try:
                await self.service.enqueue(queue, records)
                return True
            except VQError as exc:
                if not exc.retriable:
                    log.error("late_record_not_forwarded", extra={
                        "queue": queue, "error": str(exc),
                        "why": "refused for good: it stays in the old layout's topic"})
                    return True
                await asyncio.sleep(RETRY_S)
        return False
