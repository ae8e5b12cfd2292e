"""The Kafka adapter: the only package that imports confluent-kafka.

Every class here runs the blocking C client in threads of its own and hands results to asyncio
through futures. Kafka errors become registry errors (`vqueues.errors`) at this edge only:
`translate` for a `KafkaError`, `kafka_errors()` around calls that raise `KafkaException`, and
`poll` for the one consume loop every reader here shares.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from vqueues.errors import BrokerError

log = logging.getLogger(__name__)

_TIMEOUTS = {KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT, KafkaError._MSG_TIMED_OUT}
_UNREACHABLE = {KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN, KafkaError._RESOLVE,
                KafkaError.BROKER_NOT_AVAILABLE, KafkaError.NETWORK_EXCEPTION}


def client_config(bootstrap: str, extra: dict[str, str] | None = None,
                  **conf: Any) -> dict[str, Any]:
    """A librdkafka config: bootstrap, our settings, then the user's pass-through options."""
    out: dict[str, Any] = {"bootstrap.servers": bootstrap, "client.dns.lookup": "use_all_dns_ips"}
    out.update(conf)
    out.update(extra or {})
    return out


def translate(err: KafkaError, what: str = "") -> BrokerError:
    """A Kafka error as the registry's broker error (all retriable)."""
    code = err.code()
    name = ("broker_timeout" if code in _TIMEOUTS
            else "broker_unreachable" if code in _UNREACHABLE else "broker_error")
    where = f" ({what})" if what else ""
    return BrokerError(name, f"Kafka{where}: {err.str()}", kafka_error=err.name())


@contextlib.contextmanager
def kafka_errors(what: str = "") -> Iterator[None]:
    """Turn a `KafkaException` raised inside the block into a `BrokerError`."""
    try:
        yield
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError):
            raise translate(err, what) from None
        raise BrokerError("broker_error", f"Kafka ({what}): {exc}") from None


def is_fatal(err: KafkaError) -> bool:
    """A fatal error: librdkafka reports it as an `_FATAL` event whose own flag is not set."""
    return err.fatal() or err.code() == KafkaError._FATAL


class FatalKafkaError(BrokerError):
    """librdkafka raised a fatal error: this client instance can do nothing more (a static
    member fenced by a newer member with its `group.instance.id`, say) and must be replaced."""


@dataclass(slots=True)
class Polled:
    """One poll's data messages, and the partitions whose end it reached (partition -> offset)."""

    # confluent_kafka.Message, typed Any: its stubs allow None partition/offset, which only
    # error events have, and those never reach this list.
    messages: list[Any] = field(default_factory=list)
    ends: dict[int, int] = field(default_factory=dict)


def poll(consumer: Any, max_messages: int, timeout_s: float, *, strict: bool = True) -> Polled:
    """Up to `max_messages` messages: wait at most `timeout_s` for the first, then take only what
    is already buffered (`Consumer.consume(n, t)` would wait the whole `t` until it has n).

    Partition-EOF events go to `ends`. A fatal error raises `FatalKafkaError`; any other error
    raises `BrokerError`, unless `strict` is off: then it is logged and skipped (a long-lived tail
    goes on).
    """
    out = Polled()
    first = consumer.poll(timeout_s)
    if first is None:
        return out
    batch = [first] if max_messages <= 1 else [first, *consumer.consume(max_messages - 1, 0)]
    for msg in batch:
        err = msg.error()
        if err is None:
            out.messages.append(msg)
        elif err.code() == KafkaError._PARTITION_EOF:
            out.ends[msg.partition()] = msg.offset()
        elif is_fatal(err):
            raise FatalKafkaError("broker_error", f"Kafka (consume): {err.str()}",
                                  kafka_error=err.name())
        elif strict:
            raise translate(err, "consume")
        else:
            log.warning("kafka_consume_error", extra={"error": err.str(), "code": err.name()})
    return out
