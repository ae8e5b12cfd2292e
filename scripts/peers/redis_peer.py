"""Redis Streams (Debian's redis-server 7.0, AOF everysec), driven by redis-py with hiredis."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
from typing import Any

from peers.base import ServerPeer
from peers.common import VALUE, Server


def available() -> str:
    """Why Redis cannot run here, or ''."""
    if shutil.which("redis-server") is None:
        return "redis-server is not installed (Debian: apt-get install redis-server)"
    try:
        import redis.asyncio  # noqa: F401
    except ImportError:
        return "redis-py is not installed (pip install redis hiredis)"
    return ""


class Redis(ServerPeer):
    key = "redis"
    label = "Redis Streams 7"
    settings = ("`appendonly yes`, `appendfsync everysec`, `save \"\"` (no RDB snapshots)",
                "one server, no replica",
                "client: redis-py asyncio with hiredis, a pool of up to 64 connections")
    durability = ("written to the AOF before the reply, fsynced once a second: a power loss "
                  "loses up to about a second of acknowledged writes; not replicated")
    few_queues_note = "a queue is a stream (`XADD`)"
    many_queues_note = few_queues_note
    work_note = ("a consumer group per stream: `XREADGROUP COUNT n` + `XACK` of what it got, "
                 "16 asyncio workers")
    restart_note = "redis-server restarted (SIGTERM), loading its AOF"

    def __init__(self) -> None:
        super().__init__()
        self.client: Any = None

    def spawn(self) -> Server:
        return Server("redis", [
            shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind",
            "127.0.0.1", "--dir", str(self.folder), "--save", "", "--appendonly", "yes",
            "--appendfsync", "everysec", "--protected-mode", "no"]).start()

    async def connect(self) -> None:
        import redis.asyncio as aredis
        client = aredis.Redis(host="127.0.0.1", port=self.port, max_connections=64)
        try:
            await client.ping()
        except BaseException:
            await client.aclose()
            raise
        self.client = client

    async def close(self) -> None:
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self.client.aclose()
            self.client = None

    @property
    def connected(self) -> bool:
        return self.client is not None

    @property
    def r(self) -> Any:
        assert self.client is not None
        return self.client

    async def put_batch(self, name: str, count: int) -> None:
        pipe = self.r.pipeline(transaction=False)
        for _ in range(count):
            pipe.xadd(name, {"v": VALUE})
        await pipe.execute()

    async def put_one(self, name: str) -> None:
        await self.r.xadd(name, {"v": VALUE})

    async def e2e(self, name: str, samples: int) -> list[float]:
        import redis.asyncio as aredis
        reader = aredis.Redis(host="127.0.0.1", port=self.port)
        last = "$"
        out = []
        try:
            await self.r.xadd(name, {"v": b"start"})
            for _ in range(samples):
                task = asyncio.create_task(reader.xread({name: last}, count=1, block=5000))
                await asyncio.sleep(0.002)  # parked
                t0 = time.perf_counter()
                await self.r.xadd(name, {"v": VALUE})
                got = await task
                out.append(time.perf_counter() - t0)
                assert got, "XREAD BLOCK came back empty"
                last = got[0][1][-1][0]
        finally:
            await reader.aclose()
        return out

    async def work(self, names: list[str], total: int, workers: int, per_call: int
                   ) -> tuple[int, int]:
        for st in names:
            await self.r.xgroup_create(st, "g", id="0", mkstream=True)
        return await xreadgroup_drain(self.r, names, total, workers, per_call)

    async def read_first(self, name: str) -> bool:
        try:
            return await self.reconnected() and bool(await self.r.xrange(name, count=1))
        except Exception:
            return False


async def xreadgroup_drain(r: Any, names: list[str], total: int, workers: int, per_call: int
                           ) -> tuple[int, int]:
    """`total` records from the streams `names` (consumer group "g"), `workers` asyncio
    workers each taking a stream in turn: `XREADGROUP COUNT per_call`, then `XACK` of what it
    got: (records, calls)."""
    done = calls = 0

    async def worker(i: int) -> None:
        nonlocal done, calls
        k = i
        while done < total:
            st = names[k % len(names)]
            k += 1
            got = await r.xreadgroup("g", f"c{i}", {st: ">"}, count=per_call)
            calls += 1
            ids = [mid for _, entries in got for mid, _ in entries]
            if ids:
                await r.xack(st, "g", *ids)
                calls += 1
                done += len(ids)

    await asyncio.gather(*(worker(i) for i in range(workers)))
    return done, calls
