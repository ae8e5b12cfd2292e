"""RabbitMQ (Debian's rabbitmq-server 3.10: durable classic queues, persistent messages,
publisher confirms), driven by aio-pika."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

from peers.base import ServerPeer
from peers.common import VALUE, Server, free_port

RABBIT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
CHANNELS = 16  # a channel's calls are serial: 16 of them to declare 100,000 queues in ~75 s


def available() -> str:
    if not RABBIT.exists() or shutil.which("epmd") is None:
        return "rabbitmq-server is not installed (Debian: apt-get install rabbitmq-server)"
    try:
        import aio_pika  # noqa: F401
    except ImportError:
        return "aio-pika is not installed (pip install aio-pika)"
    return ""


class Rabbit(ServerPeer):
    key = "rabbitmq"
    label = "RabbitMQ 3.10"
    settings = ("one node, no plugins, the server's defaults otherwise (classic queues)",
                "durable queues (`durable=True`), persistent messages (delivery mode 2), "
                "publisher confirms on every channel",
                "client: aio-pika, one connection, 16 channels; a batch is 100 publishes in "
                "flight on one channel, acknowledged when all are confirmed")
    durability = ("confirmed once written to the queue's message store; RabbitMQ fsyncs "
                  "before confirming persistent messages on durable queues (batched); not "
                  "replicated (one node, classic queues)")
    few_queues_note = "a queue is a durable classic queue"
    many_queues_note = ("a queue is a durable classic queue, declared before the writes (the "
                        "time it took is under Memory)")
    work_note = ("a consumer per worker with `prefetch_count` n, manual ack with "
                 "`multiple=True` once n messages (or the rest) arrived, 16 workers")
    restart_note = "the RabbitMQ node restarted (SIGTERM), recovering its durable queues"

    connect_timeout_s = 75.0

    def __init__(self) -> None:
        super().__init__()
        self.conn: Any = None
        self.channels: list[Any] = []
        self._next = 0
        self.dist_port = self.epmd_port = 0

    def _env(self) -> dict[str, str]:
        f = self.folder
        return {"HOME": str(f), "RABBITMQ_MNESIA_BASE": str(f / "mnesia"),
                "RABBITMQ_LOG_BASE": str(f / "log"), "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(self.dist_port),
                "RABBITMQ_NODENAME": "bench@localhost", "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "ERL_EPMD_PORT": str(self.epmd_port), "ERL_EPMD_ADDRESS": "127.0.0.1",
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(f / "enabled_plugins"),
                "RABBITMQ_CONFIG_FILE": str(f / "rabbitmq"),
                "RABBITMQ_PID_FILE": str(f / "rabbit.pid")}

    async def prepare(self) -> None:
        (self.folder / "enabled_plugins").write_text("[].\n")
        (self.folder / "rabbitmq.conf").write_text("loopback_users = none\n")
        self.dist_port, self.epmd_port = free_port(), free_port()
        # epmd, which Erlang would start as a daemon, started here so that it is stopped by PID.
        self.helpers = [Server("epmd", [shutil.which("epmd") or "epmd", "-port",
                                        str(self.epmd_port), "-address", "127.0.0.1"]).start()]
        await asyncio.sleep(0.2)

    def spawn(self) -> Server:
        return Server("rabbitmq", [str(RABBIT)], env=self._env(),
                      log=self.folder / "server.log").start()

    async def connect(self) -> None:
        import aio_pika
        self.conn = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{self.port}/",
                                           timeout=2)
        self.channels = [await self.conn.channel(publisher_confirms=True)
                         for _ in range(CHANNELS)]

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                await self.conn.close()
            self.conn = None
            self.channels = []

    @property
    def connected(self) -> bool:
        return self.conn is not None

    def _channel(self) -> Any:
        self._next += 1
        return self.channels[self._next % len(self.channels)]

    async def create(self, names: list[str]) -> None:
        async def declare(k: int) -> None:
            ch = self.channels[k]
            for n in names[k::len(self.channels)]:
                await ch.declare_queue(n, durable=True)
        await asyncio.gather(*(declare(k) for k in range(len(self.channels))))

    async def put_batch(self, name: str, count: int) -> None:
        import aio_pika
        ex = self._channel().default_exchange
        await asyncio.gather(*(ex.publish(aio_pika.Message(
            VALUE, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=name)
            for _ in range(count)))

    async def put_one(self, name: str) -> None:
        import aio_pika
        await self._channel().default_exchange.publish(aio_pika.Message(
            VALUE, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=name)

    async def e2e(self, name: str, samples: int) -> list[float]:
        ch = await self.conn.channel(publisher_confirms=True)
        queue = await ch.declare_queue(name, durable=True)
        arrived: asyncio.Queue[float] = asyncio.Queue()

        async def on_message(message: Any) -> None:
            arrived.put_nowait(time.perf_counter())
            await message.ack()

        tag = await queue.consume(on_message)
        out = []
        try:
            for _ in range(samples):
                await asyncio.sleep(0.002)  # the consumer idle, waiting
                t0 = time.perf_counter()
                await self.put_one(name)
                out.append(await asyncio.wait_for(arrived.get(), 5) - t0)
        finally:
            await queue.cancel(tag)
            await ch.close()
        return out

    async def work(self, names: list[str], total: int, workers: int, per_call: int
                   ) -> tuple[int, int]:
        done = calls = 0
        finished = asyncio.Event()
        pending: set[asyncio.Future[None]] = set()
        chans = []
        for _ in range(workers):
            ch = await self.conn.channel()
            await ch.set_qos(prefetch_count=per_call)
            chans.append(ch)

        async def worker(i: int) -> None:
            # Each worker consumes from one queue (workers i, i+10, ... share queue i), holds
            # up to `per_call` unacknowledged, and acks them all with one `multiple` ack.
            nonlocal done, calls
            queue = await chans[i].declare_queue(names[i % len(names)], durable=True)
            held: list[Any] = []
            flush: asyncio.TimerHandle | None = None

            async def ack_held() -> None:
                nonlocal done, calls, held
                if not held:
                    return
                last, n = held[-1], len(held)
                held = []
                await last.ack(multiple=True)
                calls += 1
                done += n
                if done >= total:
                    finished.set()

            def later() -> None:
                pending.add(task := asyncio.ensure_future(ack_held()))
                task.add_done_callback(pending.discard)

            async def on_message(message: Any) -> None:
                nonlocal flush
                held.append(message)
                if flush is not None:
                    flush.cancel()
                if len(held) >= per_call:
                    await ack_held()
                else:  # the queue ran dry before n: ack what there is
                    flush = asyncio.get_running_loop().call_later(0.005, later)

            tag = await queue.consume(on_message)
            await finished.wait()
            await queue.cancel(tag)

        await asyncio.gather(*(worker(i) for i in range(workers)))
        for ch in chans:
            await ch.close()
        return done, calls

    async def read_first(self, name: str) -> bool:
        try:
            if not await self.reconnected():
                return False
            queue = await self.channels[0].declare_queue(name, durable=True, passive=True)
            message = await queue.get(no_ack=False, fail=False, timeout=2)
            if message is None:
                return False
            await message.nack(requeue=True)  # read, and left for later readers
            return True
        except Exception:
            await self.close()
            return False
