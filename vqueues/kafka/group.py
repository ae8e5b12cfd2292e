"""Group membership over the data topic, and the tail of every partition it assigns.

One thread owns one confluent-kafka Consumer subscribed to the data topic. The group's
assignments and revocations and every consumed record go to a `GroupListener`, called from that
thread; the listener hands them over to asyncio. Assigned partitions are read from the beginning
(that read is the replay that builds a partition's index) and then tailed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from vqueues.kafka import kafka_errors, poll
from vqueues.records import Record
from vqueues.self_fence import SelfFence
from vqueues.storage import Consumed, GroupListener

log = logging.getLogger(__name__)

CONFIRM_RETRY_S = 0.2  # between attempts to confirm the generation after a pause


def to_record(msg: Any) -> Record:
    """A consumed confluent-kafka message as a Record."""
    headers = msg.headers()
    return Record(msg.offset(), msg.timestamp()[1], msg.value(),
                  tuple(headers) if headers else ())


class GroupMember:
    """Joins `group.id` over `topic` and feeds `listener` until `stop()`."""

    def __init__(self, conf: dict[str, Any], topic: str, listener: GroupListener,
                 batch_size: int = 2000, fence: SelfFence | None = None) -> None:
        conf = {
            **conf,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
        }
        with kafka_errors("group"):
            self._consumer = Consumer(conf)
        self._topic = topic
        self._listener = listener
        self._batch_size = batch_size
        self._fence = fence
        self._confirm_after = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vq-group", daemon=True)

    def start(self) -> None:
        self._consumer.subscribe([self._topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)
        self._thread.start()

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            self._listener.assigned([])  # joined, with nothing new to take
            return
        starts = self._listener.assigned([tp.partition for tp in partitions])
        consumer.incremental_assign(
            [TopicPartition(self._topic, tp.partition, starts.get(tp.partition, OFFSET_BEGINNING))
             for tp in partitions])

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        self._listener.revoked([tp.partition for tp in partitions], lost=False)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        self._listener.revoked([tp.partition for tp in partitions], lost=True)
        consumer.incremental_unassign(partitions)

    def _run(self) -> None:
        consumer = self._consumer
        try:
            while not self._stop.is_set():
                polled = poll(consumer, self._batch_size, 0.05, strict=False)
                if polled.messages:
                    self._flush(polled.messages)
                for partition, offset in polled.ends.items():
                    self._listener.reached_end(partition, offset)
                if self._fence is not None and self._fence.suspect:
                    self._confirm(self._fence)
        except Exception as exc:  # the thread must report, never die silently
            log.exception("group_thread_failed")
            self._listener.failed(repr(exc))
        finally:
            try:
                # Leaves the group: the partitions move at once, not after the session timeout.
                consumer.close()
            except Exception:
                log.exception("group_close_failed")

    def _confirm(self, fence: SelfFence) -> None:
        """After a pause: ask the group coordinator whether this member's generation still
        stands, by committing the positions of the assigned partitions (the coordinator checks
        member and generation; the committed offsets are not read back by vqueues). A refusal
        (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, ...) leaves the fence up: librdkafka reports the
        partitions lost on a next poll and the node drops them."""
        now = time.monotonic()
        if now < self._confirm_after:
            return
        epoch = fence.epoch
        assignment = self._consumer.assignment()
        if not assignment:
            fence.confirmed(epoch)  # nothing owned: nothing to confirm
            return
        offsets = [TopicPartition(self._topic, tp.partition, max(tp.offset, 0))
                   for tp in self._consumer.position(assignment)]
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self._confirm_after = now + CONFIRM_RETRY_S
            log.warning("ownership_not_confirmed", extra={"error": str(exc)})
            return
        fence.confirmed(epoch)

    def _flush(self, messages: list[Any]) -> None:
        positions: dict[int, int] = {}
        for m in messages:
            positions[m.partition()] = m.offset() + 1
        # Records the listener already indexed (its own writes, from their delivery reports)
        # are not decoded again: only their position counts.
        known = {p: self._listener.indexed(p) for p in positions}
        batch: list[Consumed] = [(m.partition(), m.key(), to_record(m)) for m in messages
                                 if m.offset() not in known[m.partition()]]
        # The high watermark from the fetch responses is right on every broker we support;
        # the uncached lookup is not (see docs/adr/0003-replay-end.md).
        hw: dict[int, int] = {}
        for p in positions:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, p), cached=True)
            if high >= 0:
                hw[p] = high
        self._listener.consumed(batch, hw, positions)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop consuming and leave the group (revocations are reported first)."""
        self._stop.set()
        self._thread.join(timeout_s)
