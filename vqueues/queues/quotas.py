"""Per-tenant enqueue quotas (docs/security.md): token buckets per queue-name prefix.

A quota file lists prefixes, each with records/s and bytes/s and a burst. An enqueue to a queue
is charged to the longest prefix that matches its name (a tenant); with no match it is not
limited. A bucket holds at most `burst` seconds' worth and refills continuously. A request is
admitted when the bucket holds its cost (or, for a batch larger than the burst, when the bucket
is full) and the cost is then taken, which may leave the bucket in debt: the long-run rate is
the quota whatever the batch sizes, and a large batch is never refused for good. Otherwise the
answer is 429 `quota_exceeded` with `Retry-After`, and nothing is written.

Buckets are per node: a tenant whose queues spread over n nodes may reach n times its quota
cluster-wide (each node serves only the partitions it owns).
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Quota:
    """One prefix's limits; 0 leaves that dimension unlimited."""

    prefix: str
    records_per_s: float
    bytes_per_s: float
    burst_s: float = 1.0


@dataclass(slots=True)
class _Bucket:
    rate: float
    capacity: float
    level: float
    at: float

    def refill(self, now: float) -> None:
        self.level = min(self.capacity, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self, cost: float) -> float:
        """Seconds until `cost` may be taken (0: now)."""
        need = min(cost, self.capacity)
        return 0.0 if self.level >= need else (need - self.level) / self.rate


@dataclass(frozen=True, slots=True)
class Refusal:
    prefix: str
    retry_after_s: int
    limit: str  # "records_per_s" or "bytes_per_s"


def parse(raw: object) -> list[Quota]:
    """The quota file's content: {"quotas": [{"prefix", "records_per_s", "bytes_per_s",
    "burst_s"}]}; raises ValueError naming the problem."""
    if not isinstance(raw, dict) or not isinstance(raw.get("quotas"), list):
        raise ValueError('a quota file is {"quotas": [...]}')
    out: list[Quota] = []
    seen: set[str] = set()
    for i, item in enumerate(raw["quotas"]):
        if not isinstance(item, dict) or not isinstance(item.get("prefix"), str):
            raise ValueError(f"quotas[{i}] needs a string `prefix`")
        unknown = set(item) - {"prefix", "records_per_s", "bytes_per_s", "burst_s"}
        if unknown:
            raise ValueError(f"quotas[{i}] has unknown fields {sorted(unknown)}")
        numbers = {}
        for key, default in (("records_per_s", 0.0), ("bytes_per_s", 0.0), ("burst_s", 1.0)):
            value = item.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"quotas[{i}].{key} must be a number >= 0")
            numbers[key] = float(value)
        if numbers["burst_s"] <= 0:
            raise ValueError(f"quotas[{i}].burst_s must be above 0")
        if item["prefix"] in seen:
            raise ValueError(f"quotas[{i}]: prefix {item['prefix']!r} is listed twice")
        seen.add(item["prefix"])
        out.append(Quota(item["prefix"], numbers["records_per_s"], numbers["bytes_per_s"],
                         numbers["burst_s"]))
    return out


class Quotas:
    """The node's quotas and their buckets; `charge` admits or refuses one enqueue."""

    def __init__(self, quotas: list[Quota], clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.clock = clock
        self._quotas: list[Quota] = []
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self.replace(quotas)

    def replace(self, quotas: list[Quota]) -> None:
        """New limits (a reloaded file); buckets of unchanged prefixes keep their level."""
        now = self.clock()
        old = self._buckets
        self._quotas = sorted(quotas, key=lambda q: len(q.prefix), reverse=True)
        self._buckets = {}
        for q in self._quotas:
            for limit, rate in (("records_per_s", q.records_per_s),
                                ("bytes_per_s", q.bytes_per_s)):
                if rate > 0:
                    capacity = rate * q.burst_s
                    prev = old.get((q.prefix, limit))
                    level = capacity if prev is None else min(prev.level, capacity)
                    self._buckets[(q.prefix, limit)] = _Bucket(rate, capacity, level, now)

    def match(self, queue: str) -> Quota | None:
        """The longest prefix that matches `queue`, if any."""
        return next((q for q in self._quotas if queue.startswith(q.prefix)), None)

    def charge(self, queue: str, records: int, nbytes: int) -> Refusal | None:
        """Take `records` and `nbytes` from the queue's tenant's buckets, or take nothing and
        say how long to wait."""
        quota = self.match(queue)
        if quota is None:
            return None
        now = self.clock()
        costs = (("records_per_s", float(records)), ("bytes_per_s", float(nbytes)))
        wait, which = 0.0, ""
        for limit, cost in costs:
            bucket = self._buckets.get((quota.prefix, limit))
            if bucket is not None:
                bucket.refill(now)
                w = bucket.wait_s(cost)
                if w > wait:
                    wait, which = w, limit
        if wait > 0:
            return Refusal(quota.prefix, max(1, math.ceil(wait)), which)
        for limit, cost in costs:
            bucket = self._buckets.get((quota.prefix, limit))
            if bucket is not None:
                bucket.level -= cost
        return None


class QuotaFile:
    """The quota file, reread when its modification time or size changes."""

    def __init__(self, path: str, quotas: Quotas) -> None:
        self.path = path
        self.quotas = quotas
        self._stamp: tuple[float, int] | None = None
        self.reload(strict=True)

    def reload(self, strict: bool = False) -> None:
        """Apply the file if it changed; a bad file is logged and the old limits stay (or,
        at start, with `strict`, raised)."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime, st.st_size)
            if stamp == self._stamp:
                return
            self._stamp = stamp  # a bad file is reported once, not every second
            with open(self.path, encoding="utf-8") as f:
                quotas = parse(json.load(f))
        except (OSError, ValueError) as exc:
            if strict:
                raise ValueError(f"quota file {self.path}: {exc}") from None
            log.warning("quota_file_invalid", extra={"path": self.path, "error": str(exc)})
            return
        self.quotas.replace(quotas)
        log.info("quota_file_loaded", extra={"path": self.path, "quotas": len(quotas)})
