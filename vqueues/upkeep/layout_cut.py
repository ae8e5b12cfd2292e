"""Cutting this node's partitions of the layout it leaves (ADR 19): each stops serving, gets a
marker in its data partition, is indexed up to the marker, and is written as a final snapshot
that its children in the new layout load; a cut record in the assignment topic tells them."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

from vqueues.layouts import CUT_HEADER, Cut, encode_cut
from vqueues.ownership.ownership import Ownership
from vqueues.state.partition_state import PartitionState
from vqueues.storage import Log
from vqueues.upkeep.maintenance import Maintenance

log = logging.getLogger(__name__)

MARKER_WAIT_S = 60.0  # for the tail to pass the marker; a partition not cut by then is retried
WRITES_WAIT_S = 10.0  # for the offset-topic writes in flight when serving stopped


class LayoutCut:
    """Cuts every partition this node owns, now and as it is given more, for layout `to`.
    `already_cut(p)` says whether some node cut p first (blocking: off the loop). `marker_log`
    is the data topic written with acks=all: the marker's offset must be known."""

    def __init__(self, ownership: Ownership, marker_log: Log, maintenance: Maintenance,
                 to: int, already_cut: Callable[[int], bool],
                 joined: threading.Event | None = None, join_wait_s: float = 30.0) -> None:
        self.ownership = ownership
        self.joined = joined
        self.join_wait_s = join_wait_s
        self.marker_log = marker_log
        self.maintenance = maintenance
        self.to = to
        self.already_cut = already_cut
        self._seen: set[PartitionState] = set()  # by identity: a partition given back is new
        self._waiting: list[PartitionState] = []  # ready, serving until the group is joined
        self._join_done = joined is None
        self._tasks: set[asyncio.Task[None]] = set()

    def start(self) -> None:
        """Cut once this node joined the next layout's group (`joined`; at most
        `join_wait_s`): the partitions serve meanwhile, and the restart after the cut then
        waits for no group join. A partition some node cut already never serves again."""
        self.ownership.leaving = self.to
        self.ownership.on_ready.append(self._ready)
        for state in list(self.ownership.states.values()):
            if state.ready.is_set():
                self._ready(state)
        if not self._join_done:
            self._spawn(self._wait_join())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _wait_join(self) -> None:
        assert self.joined is not None
        started = time.monotonic()
        joined = await asyncio.to_thread(self.joined.wait, self.join_wait_s)
        log.info("layout_group_joined", extra={
            "layout": self.to, "joined": joined,
            "ms": round((time.monotonic() - started) * 1000)})
        self._join_done = True
        waiting, self._waiting = self._waiting, []
        for state in waiting:
            if not state.revoked:
                state.start_cut()
                self._spawn(self._cut(state))

    def _ready(self, state: PartitionState) -> None:
        """On the loop, as the partition turns ready: before any request is served, if it is
        cut already."""
        if state in self._seen:
            return
        self._seen.add(state)
        if state.partition in self.ownership.cluster_map.cuts.get(self.to, {}):
            state.start_cut()
            self._spawn(self._give_up(state, "partition_cut_already"))
        elif self._join_done:
            state.start_cut()
            self._spawn(self._cut(state))
        else:
            self._waiting.append(state)

    async def _give_up(self, state: PartitionState, event: str) -> None:
        log.info(event, extra={"partition": state.partition, "layout": self.to})
        await self.ownership.give_up([state.partition])

    def _cut_elsewhere(self, p: int) -> bool:
        return p in self.ownership.cluster_map.cuts.get(self.to, {})

    async def _cut(self, state: PartitionState) -> None:
        p = state.partition
        started = time.monotonic()
        try:
            if self._cut_elsewhere(p) or await asyncio.to_thread(self.already_cut, p):
                await self._give_up(state, "partition_cut_already")
                return
            if not await state.wait_writes(WRITES_WAIT_S):
                log.warning("cut_writes_pending", extra={"partition": p})
            marker = state.cut.cut_at
            if marker is None:  # once: a retry keeps the marker its records were held to
                delivered = await self.marker_log.append(
                    p, [(None, b"", [(CUT_HEADER, str(self.to).encode())])])
                if delivered[0][0] < 0:
                    raise RuntimeError("the marker's offset is unknown")
                marker = delivered[0][0]
                state.set_cut(marker)
            deadline = time.monotonic() + MARKER_WAIT_S
            while state.next_offset <= marker and not state.revoked:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the tail did not pass the marker at {marker}")
                await asyncio.sleep(0.01)
            if state.revoked:
                return  # its next owner cuts it
            if self._cut_elsewhere(p):
                await self._give_up(state, "partition_cut_already")
                return
            snapshot = await self.maintenance.write_image(p, state, final=True)
            if snapshot is None:
                return
            cut = Cut(self.to, p, marker, snapshot, self.ownership.node_id)
            record = encode_cut(cut, state.generation, int(time.time() * 1000))
            await self.ownership.announce([record])
            self.ownership.cluster_map.apply([record])
            log.info("partition_cut", extra={
                "partition": p, "layout": self.to, "marker": marker, "snapshot": snapshot,
                "queues": len(state.queues), "ms": round((time.monotonic() - started) * 1000)})
            await self.ownership.give_up([p])
        except Exception:
            log.exception("partition_cut_failed", extra={"partition": p, "layout": self.to})
            if not state.revoked:  # tried again: requests keep getting 503 meanwhile
                await asyncio.sleep(1.0)
                self._spawn(self._cut(state))

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
