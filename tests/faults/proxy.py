"""A TCP proxy between the nodes and the broker that can fail on demand: drop every connection,
black-hole traffic (connections stay open, nothing passes), or add latency to every chunk.

The broker advertises the proxy's port (EmbeddedBroker's `advertised_port`), so every Kafka
client of a node goes through it. It runs its own event loop in a thread.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

CHUNK = 65536


class FaultProxy:
    def __init__(self, host: str, port: int, target_port: int) -> None:
        self.host, self.port, self.target_port = host, port, target_port
        self.latency_s = 0.0
        self._open = asyncio.Event()  # set: traffic passes; clear: black hole
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy",
                                        daemon=True)
        self._server: asyncio.base_events.Server | None = None

    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._start()).result(10)
        return self

    def stop(self) -> None:
        self._call(self._stop()).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    def _call(self, coro: object) -> Future[None]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    async def _start(self) -> None:
        self._open.set()
        self._server = await asyncio.start_server(self._accept, self.host, self.port)

    async def _stop(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._drop()

    # Faults ---------------------------------------------------------------------------------

    def drop(self) -> None:
        """Close every connection now (clients reconnect through the proxy)."""
        self._call(self._drop()).result(10)

    def black_hole(self, on: bool) -> None:
        """On: connections stay open and new ones are accepted, but no byte passes."""
        self._loop.call_soon_threadsafe(self._open.clear if on else self._open.set)

    def latency(self, seconds: float) -> None:
        self.latency_s = seconds

    async def _drop(self) -> None:
        for w in list(self._writers):
            w.transport.abort()
        self._writers.clear()

    # Forwarding -----------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            writer.transport.abort()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            data = await reader.read(CHUNK)
            if not data:
                break
            await self._open.wait()
            if self.latency_s:
                await asyncio.sleep(self.latency_s)
            writer.write(data)
            await writer.drain()
        writer.transport.abort()
