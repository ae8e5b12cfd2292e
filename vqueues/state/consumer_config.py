"""A consumer's settings (`ConsumerConfig`), its modes, and the record headers lease consumers
read and write (docs/work-queues.md)."""

from __future__ import annotations

from dataclasses import dataclass

from vqueues.records import ConsumerConfigured

CURSOR = "cursor"
LEASE = "lease"
MODES = (CURSOR, LEASE)
ORDER_KEY_HEADER = "vq-ordering-key"
# The headers a dead-lettered record carries (beside its own).
DLQ_HEADERS = ("vq-dlq-source-queue", "vq-dlq-source-offset", "vq-dlq-consumer",
               "vq-dlq-attempts", "vq-dlq-reason")


# The `prefix` of a consumer made by a per-queue lease while no prefix consumer of its name
# covered the queue: it follows one once one does (a consumer set with PUT has None).
ANY_PREFIX = ""


@dataclass(slots=True, frozen=True)
class ConsumerConfig:
    """A consumer's settings (PUT /v1/queues/{queue}/consumers/{consumer}): `max_in_flight`
    caps the records leased at once (None: the window's limit); `prefix` says the settings
    were copied from the prefix consumer over that prefix (ADR 13), or is `ANY_PREFIX` for a
    consumer a lease made with the defaults; either way the consumer follows the prefix
    consumer by its name that covers the queue. None: set on its own (PUT).
    `durable_grants`: a lease answers only once its grants are written (ADR 16); otherwise
    they are written behind the answer. `attributes`: what an SQS queue keeps beside its
    consumer's settings (ADR 17), sorted by name; a consumer that has any never expires."""

    mode: str
    max_attempts: int
    dead_letter_queue: str | None
    visibility_ms: int
    max_in_flight: int | None = None
    prefix: str | None = None
    durable_grants: bool = False
    attributes: tuple[tuple[str, str], ...] = ()


def configured(queue: str, consumer: str, config: ConsumerConfig) -> ConsumerConfigured:
    """The settings entry that gives (queue, consumer) `config`."""
    return ConsumerConfigured(queue, consumer, config.mode, config.max_attempts,
                              config.dead_letter_queue, config.visibility_ms,
                              config.max_in_flight, config.prefix, config.durable_grants,
                              config.attributes)
