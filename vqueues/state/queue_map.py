"""A partition's queues by name: `QueueMap`, sharded so that no one dict grows huge, and able to
start from a snapshot's columns (cold queues, built on first use: ADR 7)."""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from itertools import chain
from typing import Protocol

from vqueues import memory
from vqueues.state.queue_index import QueueIndex, StatefulQueueIndex

QUEUE_SHARDS = 256  # a power of two: a queue's shard is its name's hash's low bits


class ColdShards(Protocol):
    """Queues a snapshot describes that are not built into their shards yet: a `QueueMap`
    builds each on its first lookup (`take_one`) and a shard's rest when it walks the shard
    (`take`), so a takeover serves before a million queues are objects (ADR 7)."""

    def pending(self, shard: int) -> bool:
        """Whether `shard`'s queues are still to be built."""

    def left(self) -> int:
        """How many queues are still to be built, over every shard."""

    def take_one(self, shard: int, name: str) -> QueueIndex | None:
        """Build queue `name` of `shard` (None if it is not among the queues still to be
        built); it is no longer among them."""

    def take(self, shard: int, into: dict[str, QueueIndex]) -> None:
        """Build `shard`'s remaining queues into `into`; the shard is no longer pending."""

    def drop(self, shard: int) -> None:
        """Forget `shard`'s queues unbuilt; the shard is no longer pending."""


class QueueMap(MutableMapping[str, QueueIndex]):
    """Queue name -> QueueIndex, spread over QUEUE_SHARDS dicts. A dict's resize copies the
    whole table in one C call that holds the GIL, so one dict of a million queues would stall
    the loop each time it grew (ADR 15); a shard's resize copies a 256th of that.

    A map loaded from a snapshot starts with its queues `cold`: a lookup builds the queue it
    finds there, a walk of a shard (`shard_names`, iteration) builds that shard, and
    `warm_next` builds the rest a shard per call."""

    __slots__ = ("_cold", "_shards")

    def __init__(self, shards: list[dict[str, QueueIndex]] | None = None,
                 cold: ColdShards | None = None) -> None:
        self._shards = shards if shards is not None else [{} for _ in range(QUEUE_SHARDS)]
        self._cold = cold

    @staticmethod
    def shard_of(name: str) -> int:
        """The shard that holds `name` (the methods below inline it: they are hot paths)."""
        return hash(name) & (QUEUE_SHARDS - 1)

    def _warm(self, shard: int) -> None:
        cold = self._cold
        if cold is not None and cold.pending(shard):
            with memory.long_lived():  # a shard's queues, then frozen (O(1))
                cold.take(shard, self._shards[shard])
            self._forget_if_done(cold)

    def _forget_if_done(self, cold: ColdShards) -> None:
        if not cold.left():
            self._cold = None  # the snapshot's columns are freed with it

    def warm_next(self) -> bool:
        """Build the next shard whose queues are still cold; False once none is."""
        for shard in range(QUEUE_SHARDS):
            if self._cold is None:
                return False
            if self._cold.pending(shard):
                self._warm(shard)
                return self._cold is not None
        return False

    @property
    def cold(self) -> int:
        """How many queues are still to be built from the snapshot."""
        return 0 if self._cold is None else self._cold.left()

    def _take_one(self, shard: int, name: str) -> QueueIndex | None:
        cold = self._cold
        if cold is None:
            return None
        q = cold.take_one(shard, name)
        if q is not None:
            self._shards[shard][name] = q
            self._forget_if_done(cold)
        return q

    def get(self, name: str, default: QueueIndex | None = None) -> QueueIndex | None:  # type: ignore[override]
        shard = hash(name) & (QUEUE_SHARDS - 1)
        q = self._shards[shard].get(name)
        if q is None and self._cold is not None:
            q = self._take_one(shard, name)
        return default if q is None else q

    def __getitem__(self, name: str) -> QueueIndex:
        q = self.get(name)
        if q is None:
            raise KeyError(name)
        return q

    def __setitem__(self, name: str, q: QueueIndex) -> None:
        shard = hash(name) & (QUEUE_SHARDS - 1)
        if self._cold is not None:
            self._take_one(shard, name)  # replaced: never built from the snapshot later
        self._shards[shard][name] = q

    def __delitem__(self, name: str) -> None:
        shard = hash(name) & (QUEUE_SHARDS - 1)
        if self._cold is not None:
            self._take_one(shard, name)
        del self._shards[shard][name]

    def pop(self, name: str, *default: QueueIndex | None) -> QueueIndex | None:  # type: ignore[override]
        """As dict.pop: KeyError for a missing name unless a default is given."""
        shard = hash(name) & (QUEUE_SHARDS - 1)
        if self._cold is not None:
            self._take_one(shard, name)
        return self._shards[shard].pop(name, *default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __len__(self) -> int:
        return sum(map(len, self._shards)) + self.cold

    def __iter__(self) -> Iterator[str]:
        while self.warm_next():
            pass
        return chain.from_iterable(self._shards)

    def stateful(self, name: str, q: QueueIndex) -> StatefulQueueIndex:
        """`name`'s index `q` as one that can hold consumers and a deletion floor (a copy
        that replaces it here, the first time)."""
        if isinstance(q, StatefulQueueIndex):
            return q
        s = self[name] = StatefulQueueIndex(q)
        return s

    def clear_shard(self, shard: int) -> None:
        """Drop every queue of one shard (0 <= shard < QUEUE_SHARDS)."""
        cold = self._cold
        if cold is not None and cold.pending(shard):
            cold.drop(shard)
            self._forget_if_done(cold)
        self._shards[shard].clear()

    def shard_items(self, shard: int) -> list[tuple[str, QueueIndex]]:
        """The (name, entry) pairs of one shard, as `shard_names`."""
        self._warm(shard)
        return list(self._shards[shard].items())

    def shard_names(self, shard: int) -> list[str]:
        """The names in one shard (0 <= shard < QUEUE_SHARDS): a walk in bounded steps."""
        self._warm(shard)
        return list(self._shards[shard])
