"""Apache Kafka itself: the local three-broker cluster, driven by confluent-kafka (Python) and,
for the work queue, Kafka's own ShareConsumerPerformance (share groups, KIP-932)."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from typing import Any

from bench import share_group_run
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from peers.base import Peer
from peers.common import SPAWNED, VALUE
from vqueues.hashing import partition_for
from vqueues.kafka.local_cluster import KAFKA_VERSION, LocalKafkaCluster

SHARED_PARTITIONS = 16
TOPIC_PER_QUEUE_MAX = 100  # beyond this, queues are keys of one topic


class AsyncProducer:
    """confluent-kafka's Producer with a thread serving its callbacks: `await send(...)`."""

    def __init__(self, bootstrap: str, linger_ms: int = 5) -> None:
        self.p = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                           "enable.idempotence": True, "linger.ms": linger_ms,
                           "partitioner": "murmur2_random",
                           # its refused connections while the brokers restart: expected
                           "log_level": 2})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.p.poll(0.05)

    async def send(self, topic: str, key: bytes | None, count: int,
                   partition: int | None = None) -> None:
        """`count` records, resolved once the last of them is acknowledged."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        left = [count]
        failed: list[Any] = []

        def acked(err: Any, _msg: Any) -> None:
            if err is not None:
                failed.append(err)
            left[0] -= 1
            if left[0] == 0:
                loop.call_soon_threadsafe(
                    lambda: done.done() or (done.set_exception(RuntimeError(str(failed[0])))
                                            if failed else done.set_result(None)))

        extra = {} if partition is None else {"partition": partition}
        for _ in range(count):
            while True:
                try:
                    self.p.produce(topic, VALUE, key, on_delivery=acked, **extra)
                    break
                except BufferError:
                    await asyncio.sleep(0.001)
        await done

    def close(self) -> None:
        self.p.flush(30)
        self._stop.set()
        self._thread.join()


class Kafka(Peer):
    key = "kafka"
    label = f"Apache Kafka {KAFKA_VERSION} (3 brokers)"
    settings = ("the local cluster of `vqueues kafka`: 3 KRaft brokers (each also a "
                "controller), replication 3, min.insync.replicas 2, 768 MB heap each",
                "producer: confluent-kafka, acks all, idempotence on, linger.ms 5; one "
                "producer shared by the 16 writers",
                "end to end: a producer with linger.ms 0; the reader a confluent-kafka "
                "Consumer assigned the partition (no group), polling",
                "work queue: Kafka's ShareConsumerPerformance, 16 share consumers, "
                "max.poll.records n, implicit acknowledgement (each poll acknowledges the "
                "previous), share.auto.offset.reset earliest")
    durability = ("acknowledged once 2 of 3 replicas hold it (acks all, min.insync.replicas 2); "
                  "no fsync per write: a write is lost only if every replica holding it "
                  "fails before the OS writes it out")
    batching_client = "the producer's own batching (linger.ms 5)"
    few_queues_note = "a queue is a topic of one partition (10 topics)"
    many_queues_note = (f"a queue is a key of one topic of {SHARED_PARTITIONS} partitions "
                        "(100,000 topics are not practical on one cluster)")
    work_note = ("share groups (KIP-932): one topic whose 10 partitions hold the 10 queues, "
                 "Kafka's ShareConsumerPerformance with 16 share consumers; timed from the "
                 "first records (the JVM's start and the share group's join excluded)")
    restart_note = "all three brokers restarted (SIGTERM, controlled shutdown), then started"

    def __init__(self) -> None:
        self.cluster: LocalKafkaCluster | None = None
        self.producer: AsyncProducer | None = None
        self.where: dict[str, tuple[str, bytes | None]] = {}
        self.work_topics: dict[tuple[str, ...], str] = {}
        self.shared = "queues"

    @property
    def c(self) -> LocalKafkaCluster:
        assert self.cluster is not None
        return self.cluster

    async def start(self) -> None:
        self.cluster = await asyncio.to_thread(LocalKafkaCluster().start)
        SPAWNED.extend(p.process.pid for p in self.cluster.processes if p.process)
        self._topics({self.shared: SHARED_PARTITIONS})
        self.producer = AsyncProducer(self.c.bootstrap)

    def _topics(self, wanted: dict[str, int]) -> None:
        admin = self.c.admin()
        futures = admin.create_topics([NewTopic(t, n) for t, n in wanted.items()])
        for f in futures.values():
            f.result(60)
        self.c.wait_in_sync()

    async def stop(self) -> None:
        if self.producer is not None:
            await asyncio.to_thread(self.producer.close)
            self.producer = None
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop, True)
            self.cluster = None

    def server_pids(self) -> list[int]:
        if self.cluster is None:
            return []
        return [p.process.pid for p in self.cluster.processes if p.process]

    async def restart(self) -> None:
        if self.producer is not None:
            await asyncio.to_thread(self.producer.close)
            self.producer = None

        def bounce() -> None:
            for p in self.c.processes:
                self.c.signal(p.node_id, signal.SIGTERM)
            for p in self.c.processes:
                self.c.stop_broker(p.node_id)
            for p in self.c.processes:
                self.c.start_broker(p.node_id, wait=False)
            SPAWNED.extend(p.process.pid for p in self.c.processes if p.process)
        await asyncio.to_thread(bounce)

    async def after_restart(self) -> None:
        await asyncio.to_thread(self.c.wait_ready)
        self.producer = AsyncProducer(self.c.bootstrap)

    async def create(self, names: list[str]) -> None:
        if len(names) <= TOPIC_PER_QUEUE_MAX:
            await asyncio.to_thread(self._topics, {f"q-{n}": 1 for n in names})
            self.where.update({n: (f"q-{n}", None) for n in names})

    def _where(self, name: str) -> tuple[str, bytes | None]:
        return self.where.get(name) or (self.shared, name.encode())

    @property
    def prod(self) -> AsyncProducer:
        assert self.producer is not None
        return self.producer

    async def put_batch(self, name: str, count: int) -> None:
        topic, key = self._where(name)
        await self.prod.send(topic, key, count)

    async def put_one(self, name: str, producer: AsyncProducer | None = None) -> None:
        topic, key = self._where(name)
        await (producer or self.prod).send(topic, key, 1)

    async def put_each_batched(self, names: list[str]) -> None:
        await asyncio.gather(*(self.put_one(n) for n in names))

    async def fill(self, names: list[str], per_queue: int) -> None:
        """The work queue's records: one topic, queue i in partition i."""
        topic = f"work-{uuid.uuid4().hex[:6]}"
        await asyncio.to_thread(self._topics, {topic: len(names)})
        self.work_topics[tuple(names)] = topic
        for i, _ in enumerate(names):
            left = per_queue
            while left:
                n = min(left, 10_000)
                await self.prod.send(topic, None, n, partition=i)
                left -= n

    async def e2e(self, name: str, samples: int) -> list[float]:
        topic, key = self._where(name)
        part = 0 if key is None else partition_for(name, SHARED_PARTITIONS)
        loop = asyncio.get_running_loop()
        arrived: asyncio.Queue[float] = asyncio.Queue()
        consumer = Consumer({"bootstrap.servers": self.c.bootstrap, "group.id": "e2e",
                             "enable.auto.commit": False, "enable.partition.eof": False})
        consumer.assign([TopicPartition(topic, part, -1)])  # the end
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                m = consumer.poll(0.1)  # returns at the first record (consume() waits for n)
                if m is not None and not m.error():
                    now = time.perf_counter()
                    loop.call_soon_threadsafe(arrived.put_nowait, now)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        # Tuned for latency as its users would: no linger (the writers' producer lingers 5 ms).
        quick = AsyncProducer(self.c.bootstrap, linger_ms=0)
        out = []
        try:
            # Until the reader has found the end: a record written before it did is skipped.
            for _ in range(60):
                await self.put_one(name, quick)
                try:
                    await asyncio.wait_for(arrived.get(), 0.5)
                    break
                except TimeoutError:
                    continue
            await asyncio.sleep(0.6)
            while not arrived.empty():
                arrived.get_nowait()
            for _ in range(samples):
                await asyncio.sleep(0.002)
                t0 = time.perf_counter()
                await self.put_one(name, quick)
                out.append(await asyncio.wait_for(arrived.get(), 5) - t0)
        finally:
            await asyncio.to_thread(quick.close)
            stop.set()
            await asyncio.to_thread(reader.join)
            consumer.close()
        return out

    async def work(self, names: list[str], total: int, workers: int, per_call: int
                   ) -> tuple[int, int]:
        res = await asyncio.to_thread(share_group_run, self.c, self.work_topics[tuple(names)],
                                      total, workers, per_call)
        # From the first records on: the seconds before them went to joining the share group.
        self.last_wall_s = res["records"] / max(res["steady_rate"], 1e-9)
        self.last_note = (f"from the first records; {res['to_first_s']:.1f} s before them "
                          f"(joining the share group) excluded; {res['rate']:,.0f}/s with them")
        return int(res["records"]), 0

    async def read_first(self, name: str) -> bool:
        topic, key = self._where(name)
        part = 0 if key is None else partition_for(name, SHARED_PARTITIONS)
        return await asyncio.to_thread(self._read_partitions, topic, [part])

    def _read_partitions(self, topic: str, parts: list[int], timeout_s: float = 120) -> bool:
        """True once one consumer read a record of each of `parts` (from their starts)."""
        consumer = Consumer({"bootstrap.servers": self.c.bootstrap, "group.id": "restart",
                             "enable.auto.commit": False, "log_level": 2})
        try:
            consumer.assign([TopicPartition(topic, p, 0) for p in parts])
            seen: set[int] = set()
            deadline = time.monotonic() + timeout_s
            while len(seen) < len(parts) and time.monotonic() < deadline:
                seen.update(m.partition() for m in consumer.consume(100, 0.1)
                            if not m.error())
            return len(seen) == len(parts)
        finally:
            consumer.close()

    async def all_ready(self, names: list[str]) -> bool:
        return await asyncio.to_thread(self._read_partitions, self.shared,
                                       list(range(SHARED_PARTITIONS)))
