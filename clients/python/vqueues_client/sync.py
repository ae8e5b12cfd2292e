"""A blocking facade over AsyncClient, for code without an event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from vqueues_client.client import AsyncClient
from vqueues_client.types import (
    EnqueueResult,
    Lease,
    LeasePage,
    NewRecord,
    ReadResult,
    RecordResult,
    Value,
)

T = TypeVar("T")


class Client:
    """`with Client("http://node:8080") as vq: vq.enqueue("q", "x")`: every method blocks.

    It runs an AsyncClient on an event loop in a background thread of its own.
    """

    def __init__(self, urls: str | list[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vqueues-client",
                                        daemon=True)
        self._thread.start()
        self._async = self._run(self._make(urls, options))

    @staticmethod
    async def _make(urls: str | list[str], options: dict[str, Any]) -> AsyncClient:
        return AsyncClient(urls, **options)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_running():
            self._run(self._async.close())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()

    def enqueue(self, queue: str, values: list[Value | NewRecord] | Value | NewRecord,
                headers: dict[str, str] | None = None, **record: Any) -> EnqueueResult:
        """`record`: idempotency_key, tags, deliver_at, delay_ms (for one plain value)."""
        return self._run(self._async.enqueue(queue, values, headers, **record))

    def enqueue_many(self, records: list[tuple[str, Value | NewRecord]], **kw: Any
                     ) -> list[RecordResult]:
        """Records to many queues: one call per owner node (AsyncClient.enqueue_many)."""
        return self._run(self._async.enqueue_many(records, **kw))

    def cancel_scheduled(self, queue: str, record_id: int) -> dict[str, Any] | None:
        return self._run(self._async.cancel_scheduled(queue, record_id))

    def read(self, queue: str, **kw: Any) -> ReadResult:
        return self._run(self._async.read(queue, **kw))

    def ack(self, queue: str, consumer: str, offset: int, *, allow_rewind: bool = False
            ) -> dict[str, Any]:
        return self._run(self._async.ack(queue, consumer, offset, allow_rewind=allow_rewind))

    def queue_info(self, queue: str) -> dict[str, Any] | None:
        return self._run(self._async.queue_info(queue))

    def delete_queue(self, queue: str) -> dict[str, Any] | None:
        return self._run(self._async.delete_queue(queue))

    def delete_consumer(self, queue: str, consumer: str) -> dict[str, Any] | None:
        return self._run(self._async.delete_consumer(queue, consumer))

    def cluster_map(self) -> dict[str, Any]:
        return self._run(self._async.cluster_map())

    # Work queues ---------------------------------------------------------------------------------

    def configure_consumer(self, queue: str, consumer: str, **settings: Any) -> dict[str, Any]:
        return self._run(self._async.configure_consumer(queue, consumer, **settings))

    def consumer_settings(self, queue: str, consumer: str) -> dict[str, Any] | None:
        return self._run(self._async.consumer_settings(queue, consumer))

    def lease(self, queue: str, consumer: str, **kw: Any) -> LeasePage[str]:
        """AsyncClient.lease: `complete=[...]` completes finished leases in the same call."""
        return self._run(self._async.lease(queue, consumer, **kw))

    def complete(self, queue: str, consumer: str, leases: Any) -> dict[str, Any]:
        return self._run(self._async.complete(queue, consumer, leases))

    def retry(self, queue: str, consumer: str, leases: Any, **kw: Any) -> dict[str, Any]:
        return self._run(self._async.retry(queue, consumer, leases, **kw))

    def extend(self, queue: str, consumer: str, leases: Any, visibility_ms: int
               ) -> dict[str, Any]:
        return self._run(self._async.extend(queue, consumer, leases, visibility_ms))

    def configure_prefix_consumer(self, consumer: str, prefix: str, **settings: Any
                                  ) -> dict[str, Any]:
        return self._run(self._async.configure_prefix_consumer(consumer, prefix, **settings))

    def prefix_consumers(self) -> list[dict[str, Any]]:
        return self._run(self._async.prefix_consumers())

    def delete_prefix_consumer(self, consumer: str) -> dict[str, Any] | None:
        return self._run(self._async.delete_prefix_consumer(consumer))

    def lease_prefix(self, consumer: str, node: str, **kw: Any) -> LeasePage[tuple[str, str]]:
        return self._run(self._async.lease_prefix(consumer, node, **kw))

    def complete_prefix(self, consumer: str, node: str, leases: list[Lease]) -> dict[str, Any]:
        return self._run(self._async.complete_prefix(consumer, node, leases))

    def retry_prefix(self, consumer: str, node: str, leases: list[Lease], **kw: Any
                     ) -> dict[str, Any]:
        return self._run(self._async.retry_prefix(consumer, node, leases, **kw))

    def extend_prefix(self, consumer: str, node: str, leases: list[Lease], visibility_ms: int
                      ) -> dict[str, Any]:
        return self._run(self._async.extend_prefix(consumer, node, leases, visibility_ms))

    def work(self, queues: str | list[str] | None, consumer: str, handler: Any,
             stop: threading.Event, **options: Any) -> None:
        """Run a `Worker` (handler: a plain function, run in threads) until `stop` is set;
        running handlers finish first (`queues` None and `prefix=True`: a prefix consumer)."""
        from vqueues_client.worker import Worker

        async def go() -> None:
            worker = Worker(self._async, queues, consumer, handler, **options)
            runner = asyncio.create_task(worker.run())
            # Polled: `stop` is a threading.Event, set from another thread.
            while not stop.is_set() and not runner.done():  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            await worker.stop()
            await runner

        self._run(go())
