"""Reads given offsets of one partition: the way a read reaches records older than the cache.
Implements `RecordFetcher` (vqueues/storage.py)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from vqueues.errors import BrokerError
from vqueues.kafka import kafka_errors, poll
from vqueues.kafka.group import to_record
from vqueues.records import Record
from vqueues.storage import SEEK_GAP

log = logging.getLogger(__name__)

class Fetcher:
    """A pool of assign()-mode consumers; `fetch` is blocking and thread-safe. Offsets in and
    out are tagged with `offset_base` (the topic's layout, ADR 19)."""

    def __init__(self, conf: dict[str, Any], topic: str, size: int,
                 timeout_s: float = 10.0, offset_base: int = 0) -> None:
        self._timeout_s = timeout_s
        self._base = offset_base
        conf = {
            **conf,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            # Every read assigns anew; librdkafka's default 1 s backoff after a fetch queue
            # threshold would make many reads wait a whole second.
            "fetch.queue.backoff.ms": 10,
            # Prefetch little: a read stops where its page ends and the next one assigns
            # elsewhere, but librdkafka's default (100,000 messages) keeps fetching ahead, and
            # the next read's fetch waits behind that one (ADR 15).
            "queued.min.messages": 2000,
        }
        self._topic = topic
        self._pool: queue.Queue[Consumer] = queue.Queue()
        with kafka_errors("fetcher"):
            self._all = [Consumer(conf) for _ in range(size)]
        for c in self._all:
            self._pool.put(c)
        # Learn the topic's leaders and connect to them now, off the caller's thread: the
        # first read after a start (a restart in place) otherwise pays for it.
        self._warming = threading.Thread(target=self._warm_up, name="vq-fetcher-warm-up",
                                         daemon=True)
        self._warming.start()

    def _warm_up(self) -> None:
        for c in self._all:
            try:
                c.list_topics(self._topic, timeout=10)
            except Exception as exc:  # only a head start: a read finds its own way
                log.info("fetcher_warm_up_failed", extra={"error": repr(exc)})

    def fetch(self, partition: int, offsets: Sequence[int], timeout_s: float | None = None
              ) -> dict[int, Record]:
        """Return the records at `offsets` (sorted ascending) that still exist.

        An offset whose record is gone (retention, compaction) is simply absent from the result.
        """
        found: dict[int, Record] = {}
        if not offsets:
            return found
        base = self._base
        if base:
            offsets = [o - base for o in offsets]
        consumer = self._pool.get()
        deadline = time.monotonic() + (self._timeout_s if timeout_s is None else timeout_s)
        try:
            i = 0
            while i < len(offsets):
                with kafka_errors("fetch"):
                    consumer.assign([TopicPartition(self._topic, partition, offsets[i])])
                i = self._read_run(consumer, offsets, i, found, deadline)
        finally:
            consumer.unassign()
            self._pool.put(consumer)
        return found

    def _read_run(self, consumer: Consumer, offsets: Sequence[int], i: int,
                  found: dict[int, Record], deadline: float) -> int:
        """Read forward from offsets[i] while the wanted offsets are close; return the new i."""
        while i < len(offsets):
            if time.monotonic() > deadline:
                raise BrokerError("broker_timeout", "reading records from Kafka timed out")
            span = offsets[min(len(offsets) - 1, i + 999)] - offsets[i] + 1
            polled = poll(consumer, max(1, min(span, 1000)), 0.05)
            for msg in polled.messages:
                off = msg.offset()
                while i < len(offsets) and offsets[i] < off:
                    i += 1  # that record no longer exists
                if i < len(offsets) and offsets[i] == off:
                    found[off + self._base] = to_record(msg, self._base)
                    i += 1
            if polled.ends:
                return len(offsets)  # nothing past the end: the rest do not exist
            if polled.messages and i < len(offsets):
                last = polled.messages[-1].offset()
                if offsets[i] - last > SEEK_GAP:
                    return i  # the caller seeks to offsets[i]
        return i

    def high_watermark(self, partition: int, timeout_s: float = 5.0) -> int:
        """The broker's high watermark, uncached (may underestimate on tansu: see ADR 0003)."""
        return self._watermarks(partition, timeout_s)[1] + self._base

    def log_start(self, partition: int, timeout_s: float = 5.0) -> int:
        """The partition's first retained offset (its low watermark), uncached."""
        return max(self._watermarks(partition, timeout_s)[0], 0) + self._base

    def _watermarks(self, partition: int, timeout_s: float) -> tuple[int, int]:
        consumer = self._pool.get()
        try:
            with kafka_errors("watermarks"):
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(self._topic, partition), timeout=timeout_s, cached=False)
            return int(low), int(high)
        finally:
            self._pool.put(consumer)

    def close(self) -> None:
        self._warming.join(15)  # not closed under its feet
        for c in self._all:
            c.close()
