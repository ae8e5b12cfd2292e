"""Prefix consumers: one lease consumer over every queue whose name starts with a prefix, for a
pool of workers serving very many queues (docs/work-queues.md, ADR 13).

A prefix consumer is the cluster's, not a partition's: its definition is a record of the
assignment topic (one partition, compacted), which every node already tails:
  ["p", consumer] -> {"v": 1, "prefix", "max_attempts", "visibility_ms", "dlq",
                      "max_in_flight", "weights": {queue: weight}, "ts"}
  ["p", consumer] -> tombstone: the prefix consumer was deleted
(The cluster map reads only the keys that are partition numbers.) On every queue under the
prefix the consumer is an ordinary lease consumer of that queue, its settings copied from the
definition on the first prefix lease there, so that queue's lease state, failover, fencing and
snapshots are a lease consumer's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vqueues.errors import BadRequest
from vqueues.names import MAX_NAME_BYTES, fitted_name, validate_name
from vqueues.state.consumer_config import LEASE, ConsumerConfig

# A dead-letter queue named with this placeholder is one per queue ("dead-{queue}").
QUEUE_PLACEHOLDER = "{queue}"
MAX_PREFIX_CONSUMERS = 100
MAX_WEIGHTS = 1000  # queues with a weight of their own, per prefix consumer
MAX_WEIGHT = 100
# A queue's turn takes up to this many records (times its weight): the round's quantum. One
# per turn is the strictest fairness, but a prefix lease then writes one window per record;
# a small quantum makes a prefix lease far slower than a per-queue lease (ADR 13).
RECORDS_PER_TURN = 100
MAX_RECORDS_PER_TURN = 1000
FIELDS = {"prefix", "max_attempts", "visibility_ms", "dead_letter_queue", "max_in_flight",
          "weights", "records_per_turn", "durable_grants"}


@dataclass(frozen=True, slots=True)
class PrefixConsumer:
    """`consumer` leasing from every queue whose name starts with `prefix`. A queue's records
    are leased in turns, `records_per_turn` times `weights[queue]` (default 1) at a time;
    `max_in_flight` caps each queue's records leased at once; `dead_letter_queue` is a
    queue, or a name with `{queue}` in it, one per queue."""

    consumer: str
    prefix: str
    max_attempts: int
    visibility_ms: int
    dead_letter_queue: str | None = None
    max_in_flight: int | None = None
    weights: Mapping[str, int] = field(default_factory=dict)
    records_per_turn: int = RECORDS_PER_TURN
    durable_grants: bool = False

    def covers(self, queue: str) -> bool:
        return queue.startswith(self.prefix)

    def weight_of(self, queue: str) -> int:
        return self.weights.get(queue, 1)

    def dead_letter_queue_of(self, queue: str) -> str | None:
        """The queue's dead-letter queue: `{queue}` filled in, and shortened if that makes it
        longer than a name may be (`names.fitted_name`)."""
        dlq = self.dead_letter_queue
        if dlq is not None and QUEUE_PLACEHOLDER in dlq:
            return fitted_name(dlq.replace(QUEUE_PLACEHOLDER, queue))
        return dlq

    def config_for(self, queue: str) -> ConsumerConfig:
        """The settings `queue`'s consumer gets from this prefix consumer."""
        return ConsumerConfig(LEASE, self.max_attempts, self.dead_letter_queue_of(queue),
                              self.visibility_ms, self.max_in_flight, self.prefix,
                              self.durable_grants)


def checked(consumer: str, body: Mapping[str, Any], defaults: ConsumerConfig,
            max_visibility_ms: int, max_in_flight: int) -> PrefixConsumer:
    """A prefix consumer from a PUT body (400 with the registry's codes if it is not one)."""
    validate_name(consumer, "consumer")
    unknown = set(body) - FIELDS
    if unknown:
        raise BadRequest("invalid_parameter", f"unknown prefix consumer settings "
                         f"{sorted(unknown)}")
    prefix = body.get("prefix")
    if not isinstance(prefix, str) or not prefix:
        raise BadRequest("invalid_parameter", "`prefix` must be a non-empty string")
    validate_name(prefix, "prefix")
    attempts = _int(body, "max_attempts", defaults.max_attempts, 1, 1000)
    visibility = _int(body, "visibility_ms", defaults.visibility_ms, 100, max_visibility_ms)
    cap = body.get("max_in_flight")
    if cap is not None:
        cap = _int(body, "max_in_flight", None, 1, max_in_flight)
    per_turn = _int(body, "records_per_turn", RECORDS_PER_TURN, 1, MAX_RECORDS_PER_TURN)
    dlq = body.get("dead_letter_queue")
    if dlq is not None:
        if not isinstance(dlq, str):
            raise BadRequest("invalid_parameter", "dead_letter_queue must be a queue name, "
                             "one with {queue} in it, or null")
        sample = dlq.replace(QUEUE_PLACEHOLDER, prefix + "x")
        validate_name(sample, "dead_letter_queue")
        longest = fitted_name(dlq.replace(QUEUE_PLACEHOLDER, prefix + "x" * MAX_NAME_BYTES))
        if sample.startswith(prefix) or longest.startswith(prefix):
            # its dead letters would be leased by it again
            raise BadRequest("invalid_parameter", f"dead_letter_queue {dlq!r} names queues "
                             f"under the prefix {prefix!r} itself")
    weights = body.get("weights")
    if weights is None:
        weights = {}
    if not isinstance(weights, dict) or len(weights) > MAX_WEIGHTS:
        raise BadRequest("invalid_parameter", f"weights must map at most {MAX_WEIGHTS} queue "
                         "names to integers")
    for queue in weights:
        if not queue.startswith(prefix):
            raise BadRequest("invalid_parameter", f"weights: queue {queue!r} is not under "
                             f"the prefix {prefix!r}")
        _int(weights, queue, None, 1, MAX_WEIGHT, f"weights[{queue!r}]")
    durable = body.get("durable_grants")
    if durable is not None and not isinstance(durable, bool):
        raise BadRequest("invalid_parameter", "durable_grants must be true or false")
    return PrefixConsumer(consumer, prefix, attempts, visibility, dlq, cap, dict(weights),
                          per_turn, bool(durable))


def _int(body: Mapping[str, Any], name: str, default: int | None, lo: int, hi: int,
         label: str | None = None) -> int:
    value = body.get(name)
    if value is None:  # null is left out, as on a queue's consumer
        value = default
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise BadRequest("limit_out_of_range", f"{label or name} must be an integer between "
                         f"{lo} and {hi}", parameter=label or name, min=lo, max=hi)
    return value


# The assignment topic's records --------------------------------------------------------------

def _key(consumer: str) -> bytes:
    return json.dumps(["p", consumer], ensure_ascii=False, separators=(",", ":")).encode()


def encode(pc: PrefixConsumer) -> tuple[bytes, bytes]:
    return _key(pc.consumer), json.dumps({
        "v": 1, "prefix": pc.prefix, "max_attempts": pc.max_attempts,
        "visibility_ms": pc.visibility_ms, "dlq": pc.dead_letter_queue,
        "max_in_flight": pc.max_in_flight, "weights": dict(pc.weights),
        "records_per_turn": pc.records_per_turn, "durable_grants": pc.durable_grants,
        "ts": int(time.time() * 1000)},
        ensure_ascii=False, separators=(",", ":")).encode()


def encode_deleted(consumer: str) -> tuple[bytes, None]:
    return _key(consumer), None


def decode(key: bytes | None, value: bytes | None) -> tuple[str, PrefixConsumer | None] | None:
    """(consumer, its definition or None if deleted), or None for any other record."""
    if not key or not key.startswith(b'["p"'):
        return None
    try:
        parts = json.loads(key)
        if len(parts) != 2 or parts[0] != "p":
            return None
        consumer = str(parts[1])
        if value is None:
            return consumer, None
        b = json.loads(value)
        cap = b.get("max_in_flight")
        return consumer, PrefixConsumer(
            consumer, str(b["prefix"]), int(b["max_attempts"]), int(b["visibility_ms"]),
            b.get("dlq"), int(cap) if cap is not None else None,
            {str(q): int(w) for q, w in (b.get("weights") or {}).items()},
            int(b.get("records_per_turn", RECORDS_PER_TURN)),
            bool(b.get("durable_grants", False)))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


Watcher = Callable[[str, PrefixConsumer | None], None]


class PrefixConsumers:
    """The cluster's prefix consumers as the assignment topic says (applied on the loop), and
    the prefix leases parked on each (woken when a queue under it may have a record)."""

    def __init__(self) -> None:
        self.by_name: dict[str, PrefixConsumer] = {}
        self._watchers: list[Watcher] = []
        self._parked: dict[str, set[asyncio.Future[None]]] = {}

    def apply(self, records: Sequence[tuple[bytes | None, bytes | None]]) -> None:
        for key, value in records:
            found = decode(key, value)
            if found is None:
                continue
            consumer, pc = found
            if self.by_name.get(consumer) == pc:
                continue
            if pc is None:
                del self.by_name[consumer]
            else:
                self.by_name[consumer] = pc
            for watcher in self._watchers:
                watcher(consumer, pc)

    def watch(self, watcher: Watcher) -> None:
        """Call `watcher(consumer, definition or None)` whenever one changes."""
        self._watchers.append(watcher)

    def covering(self, queue: str) -> list[PrefixConsumer]:
        """The prefix consumers whose prefix `queue` is under."""
        return [pc for pc in self.by_name.values() if queue.startswith(pc.prefix)]

    # Parked prefix leases ------------------------------------------------------------------

    def wake(self, consumer: str) -> None:
        parked = self._parked.pop(consumer, None)
        for fut in parked or ():
            if not fut.done():
                fut.set_result(None)

    async def wait(self, consumer: str, timeout_s: float) -> None:
        """Return when a queue under `consumer`'s prefix may have a record, or on timeout."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        parked = self._parked.setdefault(consumer, set())
        parked.add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            parked.discard(fut)
            if not parked and self._parked.get(consumer) is parked:
                del self._parked[consumer]
