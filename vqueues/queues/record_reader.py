"""Reading a data partition's records by offset (the cache first, then Kafka) and its ends, off
the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from vqueues.errors import BrokerError
from vqueues.records import Record
from vqueues.settings import Settings
from vqueues.state.cache import RecordCache
from vqueues.storage import RecordFetcher, runs


def _split(offset_runs: list[list[int]], ways: int) -> list[list[int]]:
    """Deal runs of offsets into at most `ways` ascending lists of whole runs."""
    if len(offset_runs) <= ways:
        return offset_runs
    size = -(-len(offset_runs) // ways)
    return [[o for run in offset_runs[i:i + size] for o in run]
            for i in range(0, len(offset_runs), size)]


class RecordReader:
    """Records by offset and partition ends, read through `fetcher` on a pool of its own."""

    def __init__(self, settings: Settings, cache: RecordCache, fetcher: RecordFetcher,
                 home: Callable[[int, int], int] | None = None) -> None:
        self.settings = settings
        self.cache = cache
        self._fetcher = fetcher
        # Where a record at an offset of partition p lives: p itself, or for an offset of an
        # earlier layout (ADR 19), the partition its queue had there, under which the node
        # cached it before the growth.
        self._home = home
        self._fetch_pool = ThreadPoolExecutor(settings.fetchers, thread_name_prefix="vq-fetch")

    async def resolve(self, partition: int, offsets: list[int]) -> list[Record]:
        """Records at `offsets`: from the cache, the rest fetched from Kafka in one pass."""
        found: dict[int, Record] = {}
        missing = []
        get, home = self.cache.get, self._home
        for off in offsets:
            rec = get(home(partition, off) if home is not None else partition, off)
            if rec is None:
                missing.append(off)
            else:
                found[off] = rec
        if missing:
            # Far-apart offsets (a sparse queue) are read as runs on several consumers at once,
            # not one broker round trip per gap after another.
            loop = asyncio.get_running_loop()
            parts = _split(runs(missing), self.settings.fetchers)
            # Bounded as a whole: fetches waiting for a free consumer count too.
            try:
                async with asyncio.timeout(self.settings.broker_timeout_ms / 1000):
                    for got in await asyncio.gather(*(
                            loop.run_in_executor(self._fetch_pool, self._fetcher.fetch,
                                                 partition, part)
                            for part in parts)):
                        found.update(got)
            except TimeoutError:
                raise BrokerError("broker_timeout", "reading records older than the cache from "
                                  f"Kafka took over broker_timeout_ms "
                                  f"({self.settings.broker_timeout_ms} ms)") from None
        return [found[o] for o in offsets if o in found]

    def log_start(self, partition: int) -> Awaitable[int]:
        """The data partition's first retained offset, read off the loop."""
        return asyncio.get_running_loop().run_in_executor(
            self._fetch_pool, self._fetcher.log_start, partition)

    def log_end(self, partition: int) -> Awaitable[int]:
        """The data partition's end as the broker reports it now (its high watermark), read
        off the loop."""
        return asyncio.get_running_loop().run_in_executor(
            self._fetch_pool, self._fetcher.high_watermark, partition)

    def close(self) -> None:
        self._fetch_pool.shutdown(wait=True, cancel_futures=True)
