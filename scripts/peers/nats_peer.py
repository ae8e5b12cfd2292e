"""NATS JetStream (Debian's nats-server 2.9, file storage), driven by nats-py."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from typing import Any

from peers.base import ServerPeer
from peers.common import VALUE, Server

STREAM = "Q"


def available() -> str:
    if shutil.which("nats-server") is None:
        return "nats-server is not installed (Debian: apt-get install nats-server)"
    try:
        import nats  # noqa: F401
    except ImportError:
        return "nats-py is not installed (pip install nats-py)"
    return ""


def subject(name: str) -> str:
    return f"q.{name}"


class Nats(ServerPeer):
    key = "nats"
    label = "NATS JetStream 2.9"
    settings = ("`nats-server -js -sd DIR` (JetStream, file storage, the server's defaults "
                "otherwise)",
                f"one stream `{STREAM}` on subjects `q.>`: file storage, limits retention, "
                "one replica",
                "client: nats-py, one connection; `publish_async` for a batch, `publish` "
                "(awaiting the ack) for one")
    durability = ("written to the stream's file (the OS's buffers) before the ack, fsynced on "
                  "a timer (`sync_interval`, 2 minutes by NATS's documentation), so a power "
                  "loss can lose acknowledged writes; not replicated (one server)")
    few_queues_note = "a queue is a subject `q.<name>` of one stream"
    many_queues_note = few_queues_note
    work_note = ("a durable pull consumer per queue (explicit ack): `fetch(n)` + `ack()` of "
                 "each message, 16 asyncio workers")
    restart_note = "nats-server restarted (SIGTERM), recovering the stream from its files"

    def __init__(self) -> None:
        super().__init__()
        self.nc: Any = None
        self.js: Any = None

    def spawn(self) -> Server:
        return Server("nats", [
            shutil.which("nats-server") or "nats-server", "-a", "127.0.0.1", "-p",
            str(self.port), "-js", "-sd", str(self.folder)]).start()

    async def connect(self) -> None:
        import nats
        self.nc = await nats.connect(f"nats://127.0.0.1:{self.port}", allow_reconnect=False,
                                     connect_timeout=1, max_outstanding_pings=5)
        self.js = self.nc.jetstream()

    async def close(self) -> None:
        if self.nc is not None:
            with contextlib.suppress(Exception):
                await self.nc.close()
            self.nc = self.js = None

    @property
    def connected(self) -> bool:
        return self.nc is not None

    async def start(self) -> None:
        from nats.js.api import StorageType, StreamConfig
        await super().start()
        await self.js.add_stream(StreamConfig(name=STREAM, subjects=["q.>"],
                                              storage=StorageType.FILE, num_replicas=1))

    async def put_batch(self, name: str, count: int) -> None:
        subj = subject(name)
        acks = [await self.js.publish_async(subj, VALUE) for _ in range(count)]
        await asyncio.gather(*acks)

    async def put_one(self, name: str) -> None:
        await self.js.publish(subject(name), VALUE)

    async def e2e(self, name: str, samples: int) -> list[float]:
        sub = await self.js.subscribe(subject(name), ordered_consumer=True)
        out = []
        try:
            for _ in range(samples):
                task = asyncio.create_task(sub.next_msg(timeout=5))
                await asyncio.sleep(0.002)  # parked
                t0 = time.perf_counter()
                await self.js.publish(subject(name), VALUE)
                await task
                out.append(time.perf_counter() - t0)
        finally:
            await sub.unsubscribe()
        return out

    async def work(self, names: list[str], total: int, workers: int, per_call: int
                   ) -> tuple[int, int]:
        import nats.errors
        from nats.js.api import AckPolicy, ConsumerConfig
        # Outside the drain: the consumers and each worker's subscription to each.
        subs: list[dict[str, Any]] = [{} for _ in range(workers)]
        for n in names:
            durable = f"w{per_call}-{n}"
            await self.js.add_consumer(STREAM, ConsumerConfig(
                durable_name=durable, filter_subject=subject(n), ack_policy=AckPolicy.EXPLICIT,
                max_ack_pending=10_000))
            for i in range(workers):
                subs[i][n] = await self.js.pull_subscribe_bind(durable, stream=STREAM)
        done = calls = 0

        async def worker(i: int) -> None:
            nonlocal done, calls
            k = i
            while done < total:
                n = names[k % len(names)]
                k += 1
                try:
                    msgs = await subs[i][n].fetch(per_call, timeout=0.05)
                except (nats.errors.TimeoutError, TimeoutError):
                    msgs = []
                calls += 1
                if msgs:
                    await asyncio.gather(*(m.ack() for m in msgs))
                    calls += 1  # the acks: one flush of len(msgs) publishes
                    done += len(msgs)

        await asyncio.gather(*(worker(i) for i in range(workers)))
        for per in subs:
            for s in per.values():
                await s.unsubscribe()
        return done, calls

    async def read_first(self, name: str) -> bool:
        try:
            return await self.reconnected() and bool(
                await self.js.get_last_msg(STREAM, subject(name)))
        except Exception:
            await self.close()
            return False
