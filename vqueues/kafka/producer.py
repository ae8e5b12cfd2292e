"""An asyncio face on confluent-kafka's Producer: a poll thread resolves futures."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from vqueues.errors import BrokerError, Unavailable

log = logging.getLogger(__name__)

# (key, value, headers) of one record to write.
Outgoing = tuple[bytes | None, bytes | None, Sequence[tuple[str, bytes]] | None]


class AsyncProducer:
    """Writes batches to explicit partitions; `send` resolves once the broker acknowledged."""

    def __init__(self, conf: dict[str, Any], name: str) -> None:
        self._producer = Producer(conf)
        self._name = name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name=f"vq-{name}-poll", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    async def send(self, topic: str, partition: int, records: Sequence[Outgoing],
                   timeout_s: float = 30.0) -> list[tuple[int, int]]:
        """Write `records` to `topic`/`partition`; return each one's (offset, timestamp) in order.

        With acks=0 the broker reports no offsets: each is -1.
        """
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        results: list[tuple[int, int]] = [(-1, -1)] * len(records)
        pending = [len(records)]
        errors: list[KafkaError] = []
        lock = threading.Lock()

        def finish() -> None:
            if done.done():
                return
            if errors:
                done.set_exception(_translate(errors[0]))
            else:
                done.set_result(results)

        def make_cb(i: int) -> Callable[[KafkaError | None, Any], None]:
            def cb(err: KafkaError | None, msg: Any) -> None:
                with lock:
                    if err is not None:
                        errors.append(err)
                    else:
                        results[i] = (msg.offset(), msg.timestamp()[1])
                    pending[0] -= 1
                    last = pending[0] == 0
                if last:
                    loop.call_soon_threadsafe(finish)
            return cb

        for i, (key, value, headers) in enumerate(records):
            for attempt in range(200):
                try:
                    self._producer.produce(topic, value=value, key=key, partition=partition,
                                           headers=list(headers) if headers else None,
                                           on_delivery=make_cb(i))
                    break
                except BufferError:
                    # Local queue full: let the poll thread drain it, without blocking the loop.
                    if attempt == 199:
                        raise Unavailable("producer_queue_full",
                                          "the node's producer queue is full; retry") from None
                    await asyncio.sleep(0.01)
                except KafkaException as exc:
                    raise _translate(exc.args[0]) from None
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout_s)
        except TimeoutError:
            raise BrokerError("broker_timeout", "the broker did not acknowledge in time") from None

    def close(self, timeout_s: float = 10.0) -> None:
        """Deliver what is queued (up to `timeout_s`), then stop the poll thread."""
        remaining = self._producer.flush(timeout_s)
        if remaining:
            log.warning("producer_unflushed", extra={"producer": self._name, "records": remaining})
        self._stop.set()
        self._thread.join(5)


def _translate(err: KafkaError) -> BrokerError:
    return BrokerError("broker_error", f"Kafka: {err.str()}", kafka_error=err.name())
