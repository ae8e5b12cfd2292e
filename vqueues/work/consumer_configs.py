"""Consumer settings: the rules of `PUT`/`GET .../consumers/{consumer}` (mode, attempts, dead-letter
queue, visibility), a first lease making a consumer a lease consumer, and a consumer under a
prefix consumer following its settings (docs/work-queues.md).

Settings are offset-topic entries (`ConsumerConfigured`), applied by the partition's lease
windows (`lease_windows.LeaseWindows`) and written through the queue service under the
consumer's lock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from vqueues.errors import BadRequest, Conflict, NotFound
from vqueues.names import validate_name
from vqueues.queues.entry_writer import EntryWriter
from vqueues.queues.service import QueueService
from vqueues.records import ConsumerAcked, ConsumerConfigured, OffsetEntry, now_ms
from vqueues.results import ConsumerSettings
from vqueues.settings import MIN_VISIBILITY_MS, Settings
from vqueues.state.consumer_config import ANY_PREFIX, CURSOR, LEASE, ConsumerConfig, configured
from vqueues.state.partition_state import PartitionState
from vqueues.state.prefix_consumers import PrefixConsumer
from vqueues.state.window import LeaseWindow

MAX_ATTEMPTS_LIMIT = 1000


class ConsumerConfigs:
    """Checks and writes consumers' settings; the defaults come from the node's settings."""

    def __init__(self, settings: Settings, queues: QueueService, entries: EntryWriter) -> None:
        self.settings = settings
        self.queues = queues
        self.entries = entries

    def defaults(self) -> ConsumerConfig:
        s = self.settings
        return ConsumerConfig(LEASE, s.default_max_attempts, None, s.default_visibility_ms)

    def of(self, state: PartitionState, queue: str, consumer: str) -> ConsumerConfig:
        """The consumer's settings, or the defaults."""
        return state.configs.get((queue, consumer)) or self.defaults()

    def check_visibility(self, visibility_ms: int, name: str = "visibility_ms") -> int:
        hi = self.settings.max_visibility_ms
        if isinstance(visibility_ms, bool) or not isinstance(visibility_ms, int) or \
                not MIN_VISIBILITY_MS <= visibility_ms <= hi:
            raise BadRequest("limit_out_of_range", f"{name} must be an integer between "
                             f"{MIN_VISIBILITY_MS} and {hi}", parameter=name,
                             min=MIN_VISIBILITY_MS, max=hi)
        return visibility_ms

    def check_in_flight(self, max_in_flight: object, name: str = "max_in_flight") -> int:
        hi = self.settings.max_lease_window
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or \
                not 1 <= max_in_flight <= hi:
            raise BadRequest("limit_out_of_range", f"{name} must be an integer between 1 and "
                             f"{hi}, or null", parameter=name, min=1, max=hi)
        return max_in_flight

    async def configure(self, queue: str, consumer: str, mode: str | None,
                        max_attempts: int | None, dead_letter_queue: str | bool | None,
                        visibility_ms: int | None, max_in_flight: int | bool | None = False,
                        prefix: str | None = None, durable_grants: bool | None = None,
                        attributes: Mapping[str, str] | None = None) -> ConsumerSettings:
        """Set a consumer's settings (absent ones keep their value, or the defaults).
        `dead_letter_queue` and `max_in_flight`: False means "not given", None clears it;
        `durable_grants` and `attributes` (what an SQS queue keeps with it) None keep them. A
        consumer set here no longer follows a prefix consumer's settings (ADR 13), unless
        `prefix` names the prefix of the prefix consumer by its name that covers the queue:
        then it takes that one's settings, and follows it again."""
        if mode is not None and mode not in (CURSOR, LEASE):
            raise BadRequest("invalid_parameter", "mode must be cursor or lease")
        pc = None
        if prefix is not None:
            pc = self.prefix_consumer(queue, consumer)
            if pc is None or pc.prefix != prefix:
                raise BadRequest("invalid_parameter", f"no prefix consumer {consumer!r} over "
                                 f"the prefix {prefix!r} covers queue {queue!r}")
            if mode == CURSOR or max_attempts is not None or visibility_ms is not None \
                    or dead_letter_queue is not False or max_in_flight is not False \
                    or durable_grants is not None:
                raise BadRequest("invalid_parameter", "`prefix` takes the prefix consumer's "
                                 "settings: give no other setting beside it (but mode lease)")
        if max_attempts is not None and (isinstance(max_attempts, bool) or not isinstance(
                max_attempts, int) or not 1 <= max_attempts <= MAX_ATTEMPTS_LIMIT):
            raise BadRequest("limit_out_of_range", "max_attempts must be an integer between 1 "
                             f"and {MAX_ATTEMPTS_LIMIT}", parameter="max_attempts", min=1,
                             max=MAX_ATTEMPTS_LIMIT)
        if visibility_ms is not None:
            self.check_visibility(visibility_ms)
        if max_in_flight is not False and max_in_flight is not None:
            self.check_in_flight(max_in_flight)
        if isinstance(dead_letter_queue, str):
            validate_name(dead_letter_queue, "dead_letter_queue")
            if dead_letter_queue == queue:
                raise BadRequest("invalid_parameter",
                                 "a queue cannot be its own dead-letter queue")
        p = self.queues.partition_of(queue)
        async with self.queues.locks.hold(("c", queue, consumer)):
            state = self.queues.ownership.require(p)
            old = state.configs.get((queue, consumer))
            if old is None:
                old = self.defaults()
                if mode is None and state.committed(queue, consumer) is not None:
                    old = ConsumerConfig(CURSOR, old.max_attempts, None, old.visibility_ms)
            new = pc.config_for(queue) if pc is not None else ConsumerConfig(
                mode or old.mode,
                old.max_attempts if max_attempts is None else max_attempts,
                old.dead_letter_queue if dead_letter_queue is False else
                (dead_letter_queue if isinstance(dead_letter_queue, str) else None),
                old.visibility_ms if visibility_ms is None else visibility_ms,
                old.max_in_flight if max_in_flight is False else
                (max_in_flight if isinstance(max_in_flight, int) else None), None,
                old.durable_grants if durable_grants is None else durable_grants,
                old.attributes if attributes is None else tuple(sorted(attributes.items())))
            entries: list[OffsetEntry] = []
            committed = state.committed(queue, consumer)
            if committed is None:
                committed = state.first_offset(queue)
                entries.append(ConsumerAcked(queue, consumer, committed, now_ms()))
            if new.mode == CURSOR:
                entries += state.window_tombstones(queue, consumer)
            entries.append(configured(queue, consumer, new))
            await self.entries.write(state, entries)
        return ConsumerSettings(queue, consumer, new.mode, new.max_attempts,
                                new.dead_letter_queue, new.visibility_ms, committed,
                                new.max_in_flight, new.prefix, new.durable_grants)

    def settings_of(self, queue: str, consumer: str) -> ConsumerSettings:
        """What `GET .../consumers/{consumer}` answers; 404 for a consumer that does not exist."""
        state = self.queues.ownership.require(self.queues.partition_of(queue))
        committed = state.committed(queue, consumer)
        config = state.configs.get((queue, consumer))
        if config is None:
            if committed is None:
                raise NotFound("consumer_not_found",
                               f"queue {queue!r} has no consumer {consumer!r}")
            d = self.defaults()
            config = ConsumerConfig(CURSOR, d.max_attempts, None, d.visibility_ms)
        return ConsumerSettings(queue, consumer, config.mode, config.max_attempts,
                                config.dead_letter_queue, config.visibility_ms, committed,
                                config.max_in_flight, config.prefix or None,
                                config.durable_grants)

    def attributes_of(self, queue: str, consumer: str) -> dict[str, str] | None:
        """The attributes kept with a consumer's settings; None if it has none (or no
        settings)."""
        state = self.queues.ownership.require(self.queues.partition_of(queue))
        config = state.configs.get((queue, consumer))
        return dict(config.attributes) if config is not None and config.attributes else None

    def with_attributes(self, consumer: str, prefix: str) -> list[str]:
        """The queues, in this node's ready partitions, whose `consumer` carries attributes
        and whose name starts with `prefix`, sorted. It walks each partition's settings (one
        per consumer that has any), not its queues."""
        names = [q for state in self.queues.ownership.states.values() if state.ready.is_set()
                 for (q, c), config in state.configs.items()
                 if c == consumer and config.attributes and q.startswith(prefix)]
        return sorted(names)

    def prefix_consumer(self, queue: str, consumer: str) -> PrefixConsumer | None:
        """The prefix consumer by this name whose prefix covers `queue`, if there is one."""
        pc = self.queues.ownership.prefixes.by_name.get(consumer)
        return pc if pc is not None and pc.covers(queue) else None

    def follow_prefix(self, state: PartitionState, queue: str, consumer: str,
                      config: ConsumerConfig) -> tuple[ConsumerConfig, ConsumerConfigured | None]:
        """A lease consumer that follows a prefix consumer (`prefix` set: it was never set on
        its own) takes the prefix consumer's current settings: they are applied here, and the
        entry returned is to be written ahead of the call's own (under the consumer's lock)."""
        if config.prefix is None or config.mode != LEASE:
            return config, None
        pc = self.prefix_consumer(queue, consumer)
        if pc is None:
            return config, None
        wanted = pc.config_for(queue)
        if wanted == config:
            return config, None
        change = configured(queue, consumer, wanted)
        state.apply_offset_entries([change])
        return state.configs[(queue, consumer)], change

    async def lease_consumer(self, state: PartitionState, queue: str, consumer: str
                             ) -> tuple[LeaseWindow, ConsumerConfig]:
        """The consumer's window and settings. A first lease makes a consumer that has never
        acked a lease consumer, with the settings of the prefix consumer by its name that covers
        the queue (or the defaults, following such a prefix consumer once one is defined),
        starting at the queue's first retained record. A consumer that has acked and was never
        set is a cursor consumer: 409. Called under the consumer's lock."""
        config = state.configs.get((queue, consumer))
        if config is not None and config.mode != LEASE:
            raise Conflict("consumer_mode_mismatch", f"consumer {consumer!r} is a cursor "
                           "consumer: read and ack, or set its mode to lease", mode=config.mode)
        if config is None:
            if state.committed(queue, consumer) is not None:
                raise Conflict("consumer_mode_mismatch", f"consumer {consumer!r} is a cursor "
                               "consumer (it has acked): read and ack, or set its mode to "
                               "lease", mode=CURSOR)
            pc = self.prefix_consumer(queue, consumer)
            config = (pc.config_for(queue) if pc is not None
                      else replace(self.defaults(), prefix=ANY_PREFIX))
            entries: list[OffsetEntry] = [
                ConsumerAcked(queue, consumer, state.first_offset(queue), now_ms()),
                configured(queue, consumer, config)]
            await self.entries.write(state, entries)
        work = state.windows.get((queue, consumer))
        if work is None:  # revoked meanwhile (the write was not applied)
            self.queues.ownership.require(state.partition)
            raise Conflict("consumer_mode_mismatch", "the consumer changed meanwhile; retry")
        return work, config
