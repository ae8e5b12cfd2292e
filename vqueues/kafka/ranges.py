"""Offset ranges of a topic's partitions: their true ends, and reading [start, end) of one.

Used by the Spark source. The end of a partition is found by consuming to its EOF from the
uncached latest offset: on Kafka that offset is exact and the EOF comes at once; on the embedded
broker it can be the first offset of the last batch + 1, so at most one batch is read. The EOF
event carries the true end on both (see docs/adr/0003-replay-end.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from vqueues.kafka import poll


def _consumer(conf: dict[str, Any], **extra: Any) -> Consumer:
    return Consumer({"group.id": "vqueues-ranges", **extra, **conf, "enable.auto.commit": False,
                     "enable.partition.eof": True, "auto.offset.reset": "earliest"})


class OffsetRanges:
    """Driver-side: the topics, and each topic's partitions, earliest offsets and true end
    offsets (`topic`: the one given to the constructor unless named)."""

    def __init__(self, conf: dict[str, Any], topic: str = "") -> None:
        self.topic = topic
        # A fetch at the end of a partition is held by the broker up to fetch.wait.max.ms
        # before the empty answer that gives the EOF: keep that short, ends() waits for it.
        self._consumer = _consumer(conf, **{"fetch.wait.max.ms": 10})

    def topics(self, timeout_s: float = 30.0) -> dict[str, list[int]]:
        """Every topic the broker lists, with its partitions."""
        md = self._consumer.list_topics(timeout=timeout_s)
        return {name: sorted(tm.partitions) for name, tm in md.topics.items()
                if tm.error is None}

    def partitions(self, timeout_s: float = 30.0, *, topic: str = "") -> list[int]:
        topic = topic or self.topic
        md = self._consumer.list_topics(topic, timeout=timeout_s)
        tm = md.topics.get(topic)
        if tm is None or tm.error is not None:
            raise RuntimeError(f"topic {topic!r} not found: {tm.error if tm else ''}")
        return sorted(tm.partitions)

    def earliest(self, partitions: Sequence[int], timeout_s: float = 30.0, *, topic: str = ""
                 ) -> dict[int, int]:
        topic = topic or self.topic
        out = {}
        for p in partitions:
            low, _ = self._consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=timeout_s, cached=False)
            out[p] = max(int(low), 0)
        return out

    def ends(self, partitions: Sequence[int], timeout_s: float = 30.0, *, topic: str = ""
             ) -> dict[int, int]:
        """The true end (high watermark) of each partition."""
        topic = topic or self.topic
        tps = []
        for p in partitions:
            low, guess = self._consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=timeout_s, cached=False)
            tps.append(TopicPartition(topic, p, max(int(guess), int(low), 0)))
        ends: dict[int, int] = {}
        self._consumer.assign(tps)
        deadline = time.monotonic() + timeout_s
        try:
            while len(ends) < len(tps):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"finding the end of {topic} timed out")
                ends.update(poll(self._consumer, 10000, 0.1).ends)
        finally:
            self._consumer.unassign()
        return ends

    def close(self) -> None:
        self._consumer.close()


def read_range(conf: dict[str, Any], topic: str, partition: int, start: int, end: int,
               batch_size: int = 10000, idle_timeout_s: float = 60.0
               ) -> Iterator[list[Any]]:
    """Yield lists of up to `batch_size` messages with start <= offset < end, in order."""
    if start >= end:
        return
    # One partition, read straight through: fetch big and prefetch deep.
    consumer = _consumer(conf, **{"fetch.max.bytes": 64 * 1024 * 1024,
                                  "max.partition.fetch.bytes": 16 * 1024 * 1024,
                                  "queued.min.messages": 200000})
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        last_progress = time.monotonic()
        position = start
        while position < end:
            polled = poll(consumer, min(batch_size, end - position), 0.5)
            out = []
            for msg in polled.messages:
                off = msg.offset()
                if off >= end:
                    position = end
                    break
                out.append(msg)
                position = off + 1
            if polled.ends:
                position = end  # nothing more exists (gaps at the end of the range)
            if out:
                last_progress = time.monotonic()
                yield out
            elif time.monotonic() - last_progress > idle_timeout_s:
                raise TimeoutError(f"no progress reading {topic}[{partition}] at {position}")
    finally:
        consumer.close()

