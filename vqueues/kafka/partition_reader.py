"""Reads one partition in order from where it last got, keeping that place as a committed
offset of a group of its own: how a grown layout's partition forwards the records that reached
its parent's partition after the cut (ADR 19)."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, TopicPartition

from vqueues.kafka import kafka_errors, poll
from vqueues.storage import Entry


class PartitionReader:
    """Blocking, one caller at a time (calls may come from different threads in turn)."""

    def __init__(self, conf: dict[str, Any], topic: str, partition: int, group_id: str) -> None:
        self._tp = TopicPartition(topic, partition)
        with kafka_errors("partition reader"):
            self._consumer = Consumer({**conf, "group.id": group_id,
                                       "enable.auto.commit": False,
                                       "enable.partition.eof": False,
                                       "auto.offset.reset": "earliest"})

    def start(self, default: int, timeout_s: float = 30.0) -> int:
        """Read on from the committed place, or `default` if none: where reading starts."""
        with kafka_errors("partition reader"):
            committed = self._consumer.committed([self._tp], timeout=timeout_s)[0].offset
            start = committed if committed >= 0 else default
            self._consumer.assign([TopicPartition(self._tp.topic, self._tp.partition, start)])
        return int(start)

    def read(self, max_records: int, timeout_s: float) -> list[tuple[int, Entry]]:
        """Up to `max_records` next records as (Kafka offset, (key, value, headers))."""
        polled = poll(self._consumer, max_records, timeout_s)
        return [(m.offset(), (m.key(), m.value(), m.headers())) for m in polled.messages]

    def commit(self, next_offset: int) -> None:
        with kafka_errors("partition reader"):
            self._consumer.commit(offsets=[TopicPartition(
                self._tp.topic, self._tp.partition, next_offset)], asynchronous=False)

    def close(self) -> None:
        self._consumer.close()
