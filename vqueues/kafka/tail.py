"""Follows a whole topic from its beginning, forever: how every node reads the assignment topic."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from vqueues.kafka import poll

log = logging.getLogger(__name__)


class TopicTail:
    """Calls `on_batch([(key, value), ...])` from its own thread for every record, in order."""

    def __init__(self, conf: dict[str, Any], topic: str, partitions: int,
                 on_batch: Callable[[list[tuple[bytes | None, bytes | None]]], object]) -> None:
        self._consumer = Consumer({**conf, "enable.auto.commit": False,
                                   "enable.partition.eof": False,
                                   "auto.offset.reset": "earliest"})
        # Offset 0 rather than OFFSET_BEGINNING: see `read_to_end` (500 ms sooner).
        self._consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        self._on_batch = on_batch
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"vq-tail-{topic}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                polled = poll(self._consumer, 500, 0.1, strict=False)
                if polled.messages:
                    self._on_batch([(m.key(), m.value()) for m in polled.messages])
        except Exception:  # the map goes stale, which clients survive; say so loudly
            log.exception("tail_failed")
        finally:
            self._consumer.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
