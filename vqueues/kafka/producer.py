"""An asyncio face on confluent-kafka's Producer: a poll thread resolves futures."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from vqueues.errors import Unavailable
from vqueues.kafka import kafka_errors, translate
from vqueues.storage import Delivered, Outgoing

log = logging.getLogger(__name__)

# How long a record may wait for the broker's acknowledgement (librdkafka's
# message.timeout.ms): then its write fails with broker_timeout (retriable).
DELIVERY_TIMEOUT_MS = 30_000


class AsyncProducer:
    """Writes batches to explicit partitions; `send` resolves once the broker acknowledged.

    A write that the broker has not acknowledged after `message.timeout.ms` fails with
    `broker_timeout`: librdkafka times each record (30 s unless the conf says otherwise), where
    a timer per write cost 5-6 us of the loop's CPU (measured).

    With `busy_linger_ms` above the conf's linger.ms, a second librdkafka producer lingers
    that long: a `send` made while another is in flight goes through it, so writes under load
    share produce requests, and a send to an idle producer still goes out at once. librdkafka's
    linger is fixed per producer, and with none every send became a produce request of its
    own (measured: the producer's broker thread and the broker spent twice the CPU per record).
    """

    def __init__(self, conf: dict[str, Any], name: str, busy_linger_ms: int = 0) -> None:
        conf = {"message.timeout.ms": DELIVERY_TIMEOUT_MS, **conf}
        with kafka_errors("producer"):
            self._producer = Producer(conf)
            self._busy = (Producer({**conf, "linger.ms": busy_linger_ms})
                          if busy_linger_ms > float(conf.get("linger.ms", 0)) else None)
        self._in_flight = 0
        self.busy_sends = 0  # sends that went through the lingering producer
        self._name = name
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll, args=(p,), name=f"vq-{name}-poll-{i}",
                             daemon=True)
            for i, p in enumerate(p for p in (self._producer, self._busy) if p is not None)]
        for thread in self._threads:
            thread.start()

    def _poll(self, producer: Producer) -> None:
        while not self._stop.is_set():
            producer.poll(0.05)

    async def send(self, topic: str, partition: int, records: Sequence[Outgoing]
                   ) -> list[Delivered]:
        """Write `records` to `topic`/`partition`; return each one's (offset, timestamp) in order.

        With acks=0 the broker reports no offsets: each is -1 (as is a stored record whose
        offset its delivery report lacks).
        """
        # One send, one producer: its records stay in order. Sends that overlap carry no
        # order between them, so they may take either producer.
        producer = self._producer
        if self._busy is not None and self._in_flight:
            producer = self._busy
            self.busy_sends += 1
        batch = _Batch(asyncio.get_running_loop(), len(records))
        self._in_flight += 1
        try:
            # Runs of records without headers go in one call each; a record with headers on
            # its own, in its place (10% scheduled records sent every record alone: 16% of the
            # node's CPU, measured).
            start = 0
            for i, (key, value, headers) in enumerate(records):
                if headers:
                    if start < i:
                        await self._produce_batch(producer, topic, partition,
                                                  records[start:i], batch)
                    start = i + 1
                    if not self._try_produce(producer, topic, partition, key, value, headers,
                                             batch):
                        await self._produce_one(producer, topic, partition, key, value,
                                                headers, batch)
            if start < len(records):
                await self._produce_batch(producer, topic, partition,
                                          records[start:] if start else records, batch)
            # A caller that gives up cancels its wait, not the write.
            return await batch.done
        finally:
            self._in_flight -= 1

    def submit(self, topic: str, partition: int, records: Sequence[Outgoing]
               ) -> asyncio.Future[list[Delivered]]:
        """Hand `records` to librdkafka now, in order, and return the future of their delivery
        reports: submissions to one partition are written in the order they were made (all go
        through the first producer). A full
        local queue fails at once (retriable) rather than waiting."""
        loop = asyncio.get_running_loop()
        batch = _Batch(loop, len(records))
        for key, value, headers in records:
            try:
                self._producer.produce(topic, value=value, key=key, partition=partition,
                                       headers=list(headers) if headers else None,
                                       on_delivery=batch.delivered)
            except BufferError:
                raise Unavailable("producer_queue_full",
                                  "the node's producer queue is full; retry") from None
            except KafkaException as exc:
                raise translate(exc.args[0], "produce") from None
        return batch.done

    @staticmethod
    def _try_produce(producer: Producer, topic: str, partition: int, key: bytes | None,
                     value: bytes | None, headers: Sequence[tuple[str, bytes]],
                     batch: _Batch) -> bool:
        """Produce one record now; False if librdkafka's local queue is full."""
        try:
            producer.produce(topic, value=value, key=key, partition=partition,
                             headers=headers if type(headers) is list else list(headers),
                             on_delivery=batch.delivered)
            return True
        except BufferError:
            return False
        except KafkaException as exc:
            raise translate(exc.args[0], "produce") from None

    async def _produce_one(self, producer: Producer, topic: str, partition: int,
                           key: bytes | None, value: bytes | None,
                           headers: Sequence[tuple[str, bytes]] | None, batch: _Batch) -> None:
        for attempt in range(200):
            try:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 headers=list(headers) if headers else None,
                                 on_delivery=batch.delivered)
                return
            except BufferError:
                # Local queue full: let the poll thread drain it, without blocking the loop.
                if attempt == 199:
                    raise Unavailable("producer_queue_full",
                                      "the node's producer queue is full; retry") from None
                await asyncio.sleep(0.01)
            except KafkaException as exc:
                raise translate(exc.args[0], "produce") from None

    async def _produce_batch(self, producer: Producer, topic: str, partition: int,
                             records: Sequence[Outgoing], batch: _Batch) -> None:
        """Records without headers go to librdkafka in one call (`produce_batch` takes none).
        If the local queue takes only part of them, the rest follow one by one, in order."""
        messages = [{"key": key, "value": value} for key, value, _ in records]
        try:
            with kafka_errors("produce"):
                queued = producer.produce_batch(topic, messages, partition=partition,
                                                on_delivery=batch.delivered)
        except BufferError:
            queued = 0
        if queued < len(messages):
            # librdkafka queues a prefix: the first failure is where the queue was full.
            first = next((i for i, m in enumerate(messages) if "_error" in m), queued)
            if any("_error" not in m for m in messages[first:]):
                # Not a prefix: the order of what follows cannot be kept. Fail the request
                # (retriable; what was queued is written: at-least-once, as documented).
                raise Unavailable("producer_queue_full", "the node's producer queue is full")
            for key, value, _ in records[first:]:
                await self._produce_one(producer, topic, partition, key, value, None, batch)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the poll threads, then deliver what is queued (up to `timeout_s`).

        In that order, delivery callbacks only ever run on one thread at a time.
        """
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        remaining = sum(p.flush(timeout_s) for p in (self._producer, self._busy)
                        if p is not None)
        if remaining:
            log.warning("producer_unflushed", extra={"producer": self._name, "records": remaining})


class _Batch:
    """Collects one send's delivery reports. librdkafka reports a partition's deliveries in
    produce order, and a send writes to one partition, so the i-th report is the i-th record."""

    __slots__ = ("done", "errors", "loop", "pending", "results")

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int) -> None:
        self.loop = loop
        self.done: asyncio.Future[list[Delivered]] = loop.create_future()
        self.results: list[Delivered] = []
        self.errors: list[KafkaError] = []
        self.pending = size

    def delivered(self, err: KafkaError | None, msg: Any) -> None:
        # Runs on the poll thread only, so no lock is needed.
        if err is not None:
            self.errors.append(err)
            self.results.append((-1, -1))
        else:
            # None: stored, offset unknown (a retry after a lost connection that the broker
            # found a duplicate of a stored batch). Such a write counts as delivered at -1,
            # as with acks=0.
            offset = msg.offset()
            self.results.append((offset if offset is not None else -1, msg.timestamp()[1]))
        self.pending -= 1
        if self.pending == 0:
            self.loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if self.done.done():
            return
        if self.errors:
            self.done.set_exception(translate(self.errors[0], "delivery"))
        else:
            self.done.set_result(self.results)
