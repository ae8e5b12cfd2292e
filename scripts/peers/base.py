"""The operations every system under comparison provides; the workloads are built of them."""

from __future__ import annotations

import asyncio
import random
from abc import ABC, abstractmethod
from pathlib import Path

from peers.common import Server, free_port, scratch, wipe


class Peer(ABC):
    """A server started fresh (data wiped), driven through its mainstream client."""

    key = ""      # short name for files and the command line: redis, nats, rabbitmq, ...
    label = ""    # as the tables name it
    settings: tuple[str, ...] = ()    # every setting that differs from the server's defaults
    durability = ""   # what an acknowledged write survives
    batching_client = ""  # the client's own batching, when it has one (small writes)
    few_queues_note = ""  # how a queue maps onto the system when there are few
    many_queues_note = ""  # ... and when there are 100,000
    work_note = ""    # how the work queue is drained
    restart_note = ""  # what "restart" restarts
    # The last work() run's own duration, when the process it ran in took longer to start
    # than to drain (Kafka's perf tool in a JVM); None: the caller's wall time stands.
    last_wall_s: float | None = None
    last_note = ""  # ... and what it left out

    # Lifecycle -----------------------------------------------------------------------------

    @abstractmethod
    async def start(self) -> None:
        """Start the server with its data wiped; connect the client."""

    @abstractmethod
    async def stop(self) -> None:
        """Close the client, stop every process by PID, remove the data."""

    @abstractmethod
    def server_pids(self) -> list[int]:
        """The server's processes (their children are counted too)."""

    @abstractmethod
    async def restart(self) -> None:
        """Stop the server keeping its data, and spawn it again: return right after the spawn
        (the caller times the reads)."""

    async def after_restart(self) -> None:  # noqa: B027 - most systems need nothing
        """Back to the client's normal settings once the restart was timed."""

    # Queues and writes -------------------------------------------------------------------------

    async def create(self, names: list[str]) -> None:  # noqa: B027 - most need nothing
        """Make these queues exist (most systems need nothing)."""

    @abstractmethod
    async def put_batch(self, name: str, count: int) -> None:
        """`count` records to one queue in one call, acknowledged."""

    @abstractmethod
    async def put_one(self, name: str) -> None:
        """One record to one queue in one call, acknowledged."""

    async def put_each_batched(self, names: list[str]) -> None:
        """One record to each queue through the client's own batching (only where
        `batching_client` says there is one); acknowledged on return."""
        raise NotImplementedError

    async def fill(self, names: list[str], per_queue: int) -> None:
        """`per_queue` records to each queue, as fast as the client goes (untimed)."""
        for name in names:
            left = per_queue
            while left:
                n = min(left, 500)
                await self.put_batch(name, n)
                left -= n

    # Reads -----------------------------------------------------------------------------------

    @abstractmethod
    async def e2e(self, name: str, samples: int) -> list[float]:
        """Seconds from a write's call to a parked reader holding the record, one at a time."""

    @abstractmethod
    async def work(self, names: list[str], total: int, workers: int, per_call: int
                   ) -> tuple[int, int]:
        """Drain `total` records from `names` with `workers` workers taking up to `per_call`
        each call and acknowledging them: (records, calls)."""

    @abstractmethod
    async def read_first(self, name: str) -> bool:
        """True once the queue's oldest record was read (after a restart)."""

    async def all_ready(self, names: list[str]) -> bool:
        """True once every queue serves: the oldest record of 100 queues spread over all."""
        sample = random.Random(7).sample(names, min(100, len(names)))
        for name in sample:
            if not await self.read_first(name):
                return False
        return True


class ServerPeer(Peer):
    """A system of one server process this script spawns (Redis, NATS, RabbitMQ) and a client
    connected to it: the lifecycle is here; a subclass says how to spawn, connect and close."""

    connect_timeout_s = 30.0

    def __init__(self) -> None:
        self.server: Server | None = None
        self.helpers: list[Server] = []  # started before the server, stopped after it
        self.folder = Path()
        self.port = 0

    @abstractmethod
    def spawn(self) -> Server:
        """Start the server on `self.port` with its data in `self.folder`."""

    @abstractmethod
    async def connect(self) -> None:
        """Connect the client; raise if the server does not answer yet."""

    @abstractmethod
    async def close(self) -> None:
        """Close the client, whatever state it is in."""

    @property
    def connected(self) -> bool:
        raise NotImplementedError

    async def prepare(self) -> None:
        """Before the first spawn: files and helper processes the server needs."""

    async def start(self) -> None:
        self.folder = scratch(self.key)
        self.port = free_port()
        await self.prepare()
        self.server = self.spawn()
        deadline = asyncio.get_running_loop().time() + self.connect_timeout_s
        while True:
            try:
                await self.connect()
                return
            except Exception:
                if asyncio.get_running_loop().time() > deadline:
                    raise TimeoutError(f"{self.label} did not answer") from None
                await asyncio.sleep(0.02)

    async def stop(self) -> None:
        await self.close()
        for s in [self.server, *self.helpers]:
            if s is not None:
                await asyncio.to_thread(s.stop)
        self.server, self.helpers = None, []
        wipe(self.folder)

    def server_pids(self) -> list[int]:
        return [s.pid for s in [self.server, *self.helpers] if s is not None and s.process]

    async def restart(self) -> None:
        assert self.server is not None
        await self.close()
        await asyncio.to_thread(self.server.stop)
        self.server = self.spawn()

    async def after_restart(self) -> None:
        if not self.connected:
            await self.connect()

    async def reconnected(self) -> bool:
        """Connect if not connected: False while the server does not answer (restarting)."""
        if self.connected:
            return True
        try:
            await self.connect()
            return True
        except Exception:
            await self.close()
            return False
