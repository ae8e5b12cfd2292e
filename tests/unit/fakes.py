"""In-memory stand-ins for the storage seams (vqueues/storage.py), for the unit tier only.

Never used where a test claims Kafka behaviour: those tests run against a real broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence

from vqueues.records import Record
from vqueues.storage import Delivered, Entry, GroupListener, Outgoing


class MemoryLog:
    """A topic in memory: per partition a list of (key, value, headers), offsets from 0.

    With a `tail` listener, appended records are delivered to it as the group's tail would
    deliver them (so read-your-writes works in unit tests).
    """

    def __init__(self, tail: GroupListener | None = None) -> None:
        self.partitions: dict[int, list[Outgoing]] = {}
        self.starts: dict[int, int] = {}  # partition -> log start (a fake retention)
        self.tail = tail
        self.fail_next: Exception | None = None
        # The next append is stored, then fails with this (its answer lost, or too late), and
        # the tail reads it `late_tail_s` later (a broker that stalled and came back).
        self.store_then_fail: Exception | None = None
        # The next append is stored and reported without offsets (librdkafka's report of a
        # batch resent after a dropped connection that the broker had stored), and the tail
        # reads it `late_tail_s` later.
        self.store_unreported = False
        self.late_tail_s = 0.05
        self.timestamp = 1_700_000_000_000
        # While set, `submit`ted writes are held in flight (not yet in the log) until `crash`
        # fails them: what a node that dies loses of the writes it had answered behind.
        self.hold = False
        self._held: list[asyncio.Future[list[Delivered]]] = []

    async def append(self, partition: int, records: Sequence[Outgoing]) -> list[Delivered]:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        if self.store_then_fail is not None or self.store_unreported:
            stored_error, self.store_then_fail = self.store_then_fail, None
            self.store_unreported = False
            tail, self.tail = self.tail, None
            start = self.end(partition)
            try:
                delivered = self._write(partition, records)
            finally:
                self.tail = tail
            asyncio.get_running_loop().call_later(self.late_tail_s, self._read_late,
                                                  partition, start, len(records))
            if stored_error is not None:
                raise stored_error
            return [(-1, ts) for _, ts in delivered]
        return self._write(partition, records)

    def _read_late(self, partition: int, start: int, count: int) -> None:
        if self.tail is None:
            return
        log = self.partitions[partition]
        self.tail.consumed(
            [(partition, key, Record(o, self.timestamp, value, tuple(headers or ())))
             for o, (key, value, headers) in enumerate(log[start:start + count], start)],
            {partition: len(log)}, {partition: start + count})

    def _write(self, partition: int, records: Sequence[Outgoing]) -> list[Delivered]:
        log = self.partitions.setdefault(partition, [])
        out: list[Delivered] = []
        consumed = []
        for key, value, headers in records:
            offset = len(log)
            log.append((key, value, headers))
            out.append((offset, self.timestamp))
            consumed.append((partition, key, Record(offset, self.timestamp, value,
                                                    tuple(headers or ()))))
        if self.tail is not None:
            self.tail.consumed(consumed, {partition: len(log)}, {partition: len(log)})
        return out

    def submit(self, partition: int, records: Sequence[Outgoing]
               ) -> Awaitable[list[Delivered]]:
        """Written at once (in call order); the awaitable gives the delivery reports."""
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            failed: asyncio.Future[list[Delivered]] = asyncio.get_running_loop().create_future()
            failed.set_exception(exc)
            return failed
        done = asyncio.get_running_loop().create_future()
        if self.hold:
            self._held.append(done)
            return done
        done.set_result(self._write(partition, records))
        return done

    async def crash(self) -> int:
        """The writer died: every write held in flight, and every write queued behind them
        (which `OffsetWriter` submits as each fails), is lost. Returns how many were."""
        lost = 0
        while self._held:
            held, self._held = self._held, []
            for fut in held:
                if not fut.done():
                    fut.set_exception(ConnectionError("the writer died"))
                    lost += 1
            for _ in range(3):  # let the failures reach the writers, which submit what waited
                await asyncio.sleep(0)
        self.hold = False
        return lost

    def read_to_end(self, partitions: Sequence[int], starts: dict[int, int] | None = None
                    ) -> dict[int, tuple[list[Entry], int]]:
        out: dict[int, tuple[list[Entry], int]] = {}
        for p in partitions:
            records = self.partitions.get(p, [])
            start = (starts or {}).get(p, 0)
            out[p] = ([(k, v, list(h) if h else None) for k, v, h in records[start:]],
                      len(records))
        return out

    def end(self, partition: int) -> int:
        return len(self.partitions.get(partition, []))


class MemoryFetcher:
    """Reads records back from a MemoryLog by offset; counts the calls."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.calls = 0

    def fetch(self, partition: int, offsets: Sequence[int]) -> dict[int, Record]:
        self.calls += 1
        records = self.log.partitions.get(partition, [])
        start = self.log.starts.get(partition, 0)
        return {o: Record(o, self.log.timestamp, records[o][1], tuple(records[o][2] or ()))
                for o in offsets if start <= o < len(records)}

    def high_watermark(self, partition: int) -> int:
        return self.log.end(partition)

    def log_start(self, partition: int) -> int:
        return self.log.starts.get(partition, 0)
