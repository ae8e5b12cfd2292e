"""An asyncio face on confluent-kafka's Producer: a poll thread resolves futures."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from vqueues.errors import Unavailable
from vqueues.kafka import kafka_errors, translate
from vqueues.storage import Delivered, Outgoing

log = logging.getLogger(__name__)

# How long a record may wait for the broker's acknowledgement (librdkafka's
# message.timeout.ms): then its write fails with broker_timeout (retriable).
DELIVERY_TIMEOUT_MS = 30_000
STATS_INTERVAL_MS = 1000  # librdkafka's statistics, for the produce request count


class AsyncProducer:
    """Writes batches to explicit partitions; `send` resolves once the broker acknowledged.

    A write that the broker has not acknowledged after `message.timeout.ms` fails with
    `broker_timeout`: librdkafka times each record (30 s unless the conf says otherwise), so
    the loop keeps no timer per write.

    With `busy_linger_ms` above the conf's linger.ms, a second librdkafka producer lingers
    that long: a `send` made while another is in flight goes through it, so writes under load
    share produce requests, and a send to an idle producer still goes out at once. librdkafka's
    linger is fixed per producer, and with none every send is a produce request of its own,
    which costs the producer's broker thread and the broker more CPU per record.
    """

    def __init__(self, conf: dict[str, Any], name: str, busy_linger_ms: int = 0) -> None:
        conf = {"message.timeout.ms": DELIVERY_TIMEOUT_MS,
                "statistics.interval.ms": STATS_INTERVAL_MS, **conf}
        # Produce requests sent, per librdkafka producer, from its statistics, and those of
        # the producers replaced.
        self._requests: list[int] = [0, 0]
        self._requests_before = 0
        self._confs: list[dict[str, Any]] = [{**conf, "stats_cb": self._stats_of(0)}]
        if busy_linger_ms > float(conf.get("linger.ms", 0)):
            self._confs.append({**conf, "linger.ms": busy_linger_ms,
                                "stats_cb": self._stats_of(1)})
        with kafka_errors("producer"):
            self._producer = Producer(self._confs[0])
            self._busy = Producer(self._confs[1]) if len(self._confs) > 1 else None
        self._in_flight = 0
        self.busy_sends = 0  # sends that went through the lingering producer
        self._name = name
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._poll, args=(i,), name=f"vq-{name}-poll-{i}",
                             daemon=True)
            for i in range(len(self._confs))]
        for thread in self._threads:
            thread.start()

    @property
    def produce_requests(self) -> int:
        """Produce requests sent to the brokers so far (as of the last statistics, at most
        STATS_INTERVAL_MS old): records per request is how well writes share requests."""
        return self._requests_before + sum(self._requests)

    def _stats_of(self, i: int) -> Any:
        def stats(raw: str) -> None:
            try:
                brokers = json.loads(raw).get("brokers", {})
                self._requests[i] = sum(int(b.get("req", {}).get("Produce", 0))
                                        for b in brokers.values())
            except (ValueError, AttributeError, TypeError):
                log.warning("producer_stats_unreadable", extra={"producer": self._name})
        return stats

    def _poll(self, i: int) -> None:
        while not self._stop.is_set():
            producer = self._producer if i == 0 else self._busy
            assert producer is not None
            producer.poll(0.05)

    def _refused(self, producer: Producer, exc: KafkaException) -> Exception:
        """The error for a produce call librdkafka refused; a producer in a fatal state (it
        refuses every call from then on) is replaced."""
        err = exc.args[0] if exc.args else None
        if not isinstance(err, KafkaError):
            return Unavailable("broker_error", f"Kafka (produce): {exc}")
        if err.fatal() or err.code() in _FENCED:
            self._replace(producer)
        return translate(err, "produce")

    def _fenced(self, producer: Producer, loop: asyncio.AbstractEventLoop) -> None:
        """From a poll thread: `producer` can write no more (below): replace it on the loop."""
        loop.call_soon_threadsafe(self._replace, producer)

    def _replace(self, broken: Producer) -> None:
        """Put a new producer (a new producer id) where `broken` was. The brokers refuse
        everything an idempotent producer writes once they fenced its id: on tansu, after a
        write timed out (message.timeout.ms) while the broker was unreachable, librdkafka's
        epoch bump is answered PRODUCER_FENCED, and without this the node never wrote again.
        What `broken` still holds fails (retriable): at-least-once, as any failed write."""
        i = 0 if broken is self._producer else 1 if broken is self._busy else -1
        if i < 0:
            return  # replaced already
        with kafka_errors("producer"):
            fresh = Producer(self._confs[i])
        self._requests_before += self._requests[i]
        self._requests[i] = 0
        if i == 0:
            self._producer = fresh
        else:
            self._busy = fresh
        log.warning("producer_replaced", extra={"producer": self._name, "which": i})
        threading.Thread(target=_retire, args=(broken,), daemon=True,
                         name=f"vq-{self._name}-retire").start()

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
        loop = asyncio.get_running_loop()
        batch = _Batch(loop, len(records), lambda: self._fenced(producer, loop))
        self._in_flight += 1
        try:
            # Runs of records without headers go in one call each; a record with headers on
            # its own, in its place, so a few scheduled records do not send every record alone.
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
        producer = self._producer
        batch = _Batch(loop, len(records), lambda: self._fenced(producer, loop))
        for key, value, headers in records:
            try:
                producer.produce(topic, value=value, key=key, partition=partition,
                                 headers=list(headers) if headers else None,
                                 on_delivery=batch.delivered)
            except BufferError:
                raise Unavailable("producer_queue_full",
                                  "the node's producer queue is full; retry") from None
            except KafkaException as exc:
                raise self._refused(producer, exc) from None
        return batch.done

    def _try_produce(self, producer: Producer, topic: str, partition: int, key: bytes | None,
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
            raise self._refused(producer, exc) from None

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
                raise self._refused(producer, exc) from None

    async def _produce_batch(self, producer: Producer, topic: str, partition: int,
                             records: Sequence[Outgoing], batch: _Batch) -> None:
        """Records without headers go to librdkafka in one call (`produce_batch` takes none).
        If the local queue takes only part of them, the rest follow one by one, in order."""
        messages = [{"key": key, "value": value} for key, value, _ in records]
        try:
            queued = producer.produce_batch(topic, messages, partition=partition,
                                            on_delivery=batch.delivered)
        except BufferError:
            queued = 0
        except KafkaException as exc:
            raise self._refused(producer, exc) from None
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


# Errors after which an idempotent producer writes nothing more: it is replaced.
_FENCED = {KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError._FENCED,
           KafkaError._FATAL}


def _retire(producer: Producer) -> None:
    """Fail what a replaced producer still holds (its callbacks run here), then let it go."""
    try:
        producer.purge(in_queue=True, in_flight=True, blocking=False)
        producer.flush(5)
    except Exception:  # it is going away either way
        log.exception("producer_retire_failed")


class _Batch:
    """Collects one send's delivery reports. librdkafka reports a partition's deliveries in
    produce order, and a send writes to one partition, so the i-th report is the i-th record."""

    __slots__ = ("done", "errors", "fenced", "loop", "pending", "results")

    def __init__(self, loop: asyncio.AbstractEventLoop, size: int,
                 fenced: Callable[[], None]) -> None:
        self.loop = loop
        self.fenced = fenced
        self.done: asyncio.Future[list[Delivered]] = loop.create_future()
        self.results: list[Delivered] = []
        self.errors: list[KafkaError] = []
        self.pending = size

    def delivered(self, err: KafkaError | None, msg: Any) -> None:
        # Runs on the poll thread only, so no lock is needed.
        if err is not None:
            if not self.errors and (err.fatal() or err.code() in _FENCED):
                self.fenced()
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
