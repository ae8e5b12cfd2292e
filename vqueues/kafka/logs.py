"""The `Log` and `OffsetLog` seams (vqueues/storage.py) on confluent-kafka."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from vqueues.errors import BrokerError
from vqueues.kafka import kafka_errors, poll
from vqueues.kafka.producer import AsyncProducer
from vqueues.storage import Delivered, Entry, Outgoing


class TopicLog:
    """One topic written through a shared `AsyncProducer`."""

    def __init__(self, producer: AsyncProducer, topic: str) -> None:
        self.producer = producer
        self.topic = topic

    async def append(self, partition: int, records: Sequence[Outgoing]) -> list[Delivered]:
        return await self.producer.send(self.topic, partition, records)

    def submit(self, partition: int, records: Sequence[Outgoing]
               ) -> Awaitable[list[Delivered]]:
        return self.producer.submit(self.topic, partition, records)


class TaggedTopicLog(TopicLog):
    """A later layout's data topic (ADR 19): the offsets it reports are tagged with
    `offset_base`."""

    def __init__(self, producer: AsyncProducer, topic: str, offset_base: int) -> None:
        super().__init__(producer, topic)
        self._base = offset_base

    async def append(self, partition: int, records: Sequence[Outgoing]) -> list[Delivered]:
        return self._tagged(await self.producer.send(self.topic, partition, records))

    def submit(self, partition: int, records: Sequence[Outgoing]
               ) -> Awaitable[list[Delivered]]:
        return self._submitted(self.producer.submit(self.topic, partition, records))

    async def _submitted(self, sent: Awaitable[list[Delivered]]) -> list[Delivered]:
        return self._tagged(await sent)

    def _tagged(self, delivered: list[Delivered]) -> list[Delivered]:
        base = self._base
        return [(o + base, ts) if o >= 0 else (o, ts) for o, ts in delivered]


class KafkaOffsetLog(TopicLog):
    """The offset topic: written like any topic, replayed with `read_to_end`."""

    def __init__(self, producer: AsyncProducer, topic: str, reader_conf: dict[str, Any]) -> None:
        super().__init__(producer, topic)
        self.reader_conf = reader_conf

    def read_to_end(self, partitions: Sequence[int], starts: dict[int, int] | None = None
                    ) -> dict[int, tuple[list[Entry], int]]:
        return read_to_end(self.reader_conf, self.topic, partitions, starts)


def read_to_end(conf: dict[str, Any], topic: str, partitions: Sequence[int],
                starts: dict[int, int] | None = None, timeout_s: float = 120.0
                ) -> dict[int, tuple[list[Entry], int]]:
    """Read `partitions` of `topic` from `starts` (default: the beginning) to their end:
    (key, value, headers) per record, and the end offset (from the partition-EOF event)."""
    out: dict[int, list[Entry]] = {p: [] for p in partitions}
    ends: dict[int, int] = {}
    if not partitions:
        return {}
    with kafka_errors(f"replaying {topic}"):
        # The end is known only from an empty fetch, which the broker holds for up to
        # fetch.wait.max.ms: keep it short here (every takeover waits for two of these).
        consumer = Consumer({**conf, "enable.auto.commit": False, "enable.partition.eof": True,
                             "auto.offset.reset": "earliest", "fetch.wait.max.ms": 10})
    try:
        with kafka_errors(f"replaying {topic}"):
            # From offset 0, not OFFSET_BEGINNING: librdkafka looks a logical offset up only
            # once it knows the partition's leader, and a fresh consumer does not yet, so it
            # retries 500 ms later (ADR 7). Below the log start,
            # auto.offset.reset moves 0 to the earliest record.
            consumer.assign([TopicPartition(topic, p, (starts or {}).get(p, 0))
                             for p in partitions])
        pending = set(partitions)
        deadline = time.monotonic() + timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise BrokerError("broker_timeout", f"replaying {topic} timed out")
            polled = poll(consumer, 1000, 0.05)
            for msg in polled.messages:
                out[msg.partition()].append((msg.key(), msg.value(), msg.headers()))
            for p, end in polled.ends.items():
                if p in pending:
                    ends[p] = end
                    pending.discard(p)
    finally:
        consumer.close()
    return {p: (out[p], ends[p]) for p in partitions}


class RecordTopic:
    """A single-partition topic read to its end and appended to one record at a time, for
    commands (`vqueues topics grow` on the assignment topic)."""

    def __init__(self, conf: dict[str, Any], topic: str) -> None:
        self.conf = conf
        self.topic = topic

    def read(self) -> list[tuple[bytes | None, bytes | None]]:
        """Every record's (key, value), in order."""
        entries, _ = read_to_end({**self.conf, "group.id": "vqueues-cli"}, self.topic, [0])[0]
        return [(key, value) for key, value, _ in entries]

    def append(self, key: bytes, value: bytes) -> None:
        """Write one record and return once every in-sync replica has it (acks=all)."""
        producer = AsyncProducer({**self.conf, "acks": "all", "enable.idempotence": True},
                                 "cli")
        try:
            asyncio.run(producer.send(self.topic, 0, [(key, value, None)]))
        finally:
            producer.close()
