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

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from vqueues.kafka import FatalKafkaError, is_fatal, kafka_errors, poll
from vqueues.records import Record
from vqueues.storage import Consumed, Fence, GroupListener

log = logging.getLogger(__name__)

CONFIRM_RETRY_S = 0.2  # between attempts to confirm the generation after a pause
REPLACE_BACKOFF_S = (0.2, 5.0)  # first and longest wait before a fatally failed consumer is
# replaced: a member fenced again and again (two nodes given one node id) must not spin


def to_record(msg: Any, offset_base: int = 0) -> Record:
    """A consumed confluent-kafka message as a Record, its offset tagged with `offset_base`
    (a layout's tag, ADR 19: 0 on layout 0)."""
    headers = msg.headers()
    return Record(msg.offset() + offset_base, msg.timestamp()[1], msg.value(),
                  tuple(headers) if headers else ())


class GroupMember:
    """Joins `group.id` over `topic` and feeds `listener` until `stop()`. The listener sees
    offsets tagged with `offset_base` (the topic's layout, ADR 19) and gives starts so tagged."""

    def __init__(self, conf: dict[str, Any], topic: str, listener: GroupListener,
                 batch_size: int = 2000, fence: Fence | None = None,
                 pace_ms: int = 0, offset_base: int = 0) -> None:
        conf = {
            **conf,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "partition.assignment.strategy": "cooperative-sticky",
        }
        self._conf = conf
        with kafka_errors("group"):
            self._consumer = Consumer(conf)
        self._closed = False
        self._owned: set[int] = set()  # what this member's consumer was given, as it reported
        self._topic = topic
        self._base = offset_base
        self._listener = listener
        self._batch_size = batch_size
        self._fence = fence
        self._pace_s = pace_ms / 1000
        self.pauses = 0  # times the tail paused after a batch of the node's own writes
        self._confirm_after = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="vq-group", daemon=True)

    def start(self) -> None:
        self._subscribe()
        self._thread.start()

    def _subscribe(self) -> None:
        self._consumer.subscribe([self._topic], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke, on_lost=self._on_lost)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            self._listener.assigned([])  # joined, with nothing new to take
            return
        self._owned.update(tp.partition for tp in partitions)
        starts = self._listener.assigned([tp.partition for tp in partitions])
        consumer.incremental_assign(
            [TopicPartition(self._topic, tp.partition, self._untag(starts.get(tp.partition)))
             for tp in partitions])

    def _untag(self, start: int | None) -> int:
        return OFFSET_BEGINNING if start is None or start < self._base else start - self._base

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        self._listener.revoked([tp.partition for tp in partitions], lost=False)
        self._owned.difference_update(tp.partition for tp in partitions)
        consumer.incremental_unassign(partitions)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        self._listener.revoked([tp.partition for tp in partitions], lost=True)
        self._owned.difference_update(tp.partition for tp in partitions)
        consumer.incremental_unassign(partitions)

    def _run(self) -> None:
        backoff, last = REPLACE_BACKOFF_S[0], 0.0
        try:
            while not self._stop.is_set():
                try:
                    self._consume_until_stopped()
                except FatalKafkaError as exc:
                    if time.monotonic() - last > 60:  # a rare fault: no penalty carried over
                        backoff = REPLACE_BACKOFF_S[0]
                    last = time.monotonic()
                    self._replace(str(exc), backoff)
                    backoff = min(backoff * 2, REPLACE_BACKOFF_S[1])
        except Exception as exc:  # the thread must report, never die silently
            log.exception("group_thread_failed")
            self._listener.failed(repr(exc))
        finally:
            self._close()

    def _consume_until_stopped(self) -> None:
        while not self._stop.is_set():
            polled = poll(self._consumer, self._batch_size, 0.05, strict=False)
            fresh = self._flush(polled.messages) if polled.messages else True
            for partition, offset in polled.ends.items():
                self._listener.reached_end(partition, offset + self._base)
            if self._fence is not None and self._fence.suspect:
                self._confirm(self._fence)
            elif not fresh and self._pace_s and len(polled.messages) < self._batch_size:
                self._pause()

    def _pause(self) -> None:
        """The tail is level with the node's own writes, which need it for nothing: fetch
        nothing for a while (each fetch costs tansu the same whatever it returns)."""
        partitions = self._consumer.assignment()
        if not partitions:
            return
        self._consumer.pause(partitions)
        try:
            self._stop.wait(self._pace_s)
        finally:
            # From the position polled up to: nothing fetched before the pause is lost.
            self._consumer.resume(partitions)
        self.pauses += 1

    def _close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            # Leaves the group: the partitions move at once, not after the session timeout.
            self._consumer.close()
        except Exception:
            log.exception("group_close_failed")

    def _replace(self, error: str, wait_s: float) -> None:
        """A fatal error ended this consumer (a static member fenced by its own earlier
        incarnation after the brokers restarted, say): drop what it owned as lost, and join
        again with a new consumer of the same configuration, after `wait_s`."""
        log.warning("group_member_replaced", extra={"error": error,
                                                    "lost": sorted(self._owned)})
        if self._owned:
            self._listener.revoked(sorted(self._owned), lost=True)
            self._owned.clear()
        self._close()
        if self._stop.wait(wait_s):
            return
        with kafka_errors("group"):
            self._consumer = Consumer(self._conf)
        self._closed = False
        self._subscribe()

    def _confirm(self, fence: Fence) -> None:
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
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and is_fatal(err):
                raise FatalKafkaError("broker_error", f"Kafka (commit): {err.str()}",
                                      kafka_error=err.name()) from None
            self._confirm_after = now + CONFIRM_RETRY_S
            log.warning("ownership_not_confirmed", extra={"error": str(exc)})
            return
        fence.confirmed(epoch)

    def _flush(self, messages: list[Any]) -> bool:
        """Hand `messages` to the listener; False if they were all its own writes, indexed
        already."""
        base = self._base
        positions: dict[int, int] = {}
        for m in messages:
            positions[m.partition()] = m.offset() + 1 + base
        # Records the listener already indexed (its own writes, from their delivery reports)
        # are not decoded again: only their position counts.
        known = {p: self._listener.indexed(p) for p in positions}
        batch: list[Consumed] = [(m.partition(), m.key(), to_record(m, base)) for m in messages
                                 if m.offset() + base not in known[m.partition()]]
        # The high watermark from the fetch responses is right on every broker we support;
        # the uncached lookup is not (see docs/adr/0003-replay-end.md).
        hw: dict[int, int] = {}
        for p in positions:
            _low, high = self._consumer.get_watermark_offsets(
                TopicPartition(self._topic, p), cached=True)
            if high >= 0:
                hw[p] = high + base
        self._listener.consumed(batch, hw, positions)
        return bool(batch)

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop consuming and leave the group (revocations are reported first)."""
        self._stop.set()
        self._thread.join(timeout_s)
