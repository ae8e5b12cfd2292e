"""Group commit for the offset topic: at most one write in flight per offset partition; the
writes made meanwhile go out together, in the order they were made, as the next one (ADR 12).

Concurrent lease and settle calls on one partition then share a produce request rather than
each waiting for its own; the broker and the producer's thread handle one request per round
trip, not one per call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from vqueues.storage import Delivered, Outgoing, Submitter

_Waiting = tuple[Sequence[Outgoing], "asyncio.Future[list[Delivered]]"]


class OffsetWriter:
    """Writes to the offset topic's partitions through `log`, grouping concurrent writes."""

    def __init__(self, log: Submitter) -> None:
        self._log = log
        self._waiting: dict[int, list[_Waiting]] = {}
        self._busy: set[int] = set()
        self.writes = 0  # produce submissions made (a figure for tests and benchmarks)

    def submit(self, partition: int, records: Sequence[Outgoing]
               ) -> asyncio.Future[list[Delivered]]:
        """Queue `records` behind every earlier write to `partition`; the future resolves with
        their delivery reports once the broker acknowledged them. A write to an idle partition
        is handed to the producer now, and fails now if the producer refuses it."""
        fut: asyncio.Future[list[Delivered]] = asyncio.get_running_loop().create_future()
        if partition in self._busy:
            self._waiting.setdefault(partition, []).append((records, fut))
        else:
            self._send(partition, [(records, fut)], raise_now=True)
        return fut

    def _send(self, partition: int, group: list[_Waiting], raise_now: bool = False) -> None:
        records = group[0][0] if len(group) == 1 else [r for recs, _ in group for r in recs]
        try:
            pending = self._log.submit(partition, records)
        except BaseException as exc:
            if raise_now:
                raise
            for _, fut in group:
                if not fut.done():
                    fut.set_exception(exc)
            self._next(partition)
            return
        self.writes += 1
        self._busy.add(partition)
        asyncio.ensure_future(pending).add_done_callback(
            lambda done: self._delivered(partition, group, done))

    def _delivered(self, partition: int, group: list[_Waiting],
                   done: asyncio.Future[list[Delivered]]) -> None:
        exc = done.exception() if not done.cancelled() else asyncio.CancelledError()
        at = 0
        for recs, fut in group:
            if not fut.done():
                if exc is not None:
                    fut.set_exception(exc)
                else:
                    fut.set_result(done.result()[at:at + len(recs)])
            at += len(recs)
        self._busy.discard(partition)
        self._next(partition)

    def _next(self, partition: int) -> None:
        group = self._waiting.pop(partition, None)
        if group:
            self._send(partition, group)
