"""The Kafka adapter: the only package that imports confluent-kafka.

Every class here runs the blocking C client in threads of its own and hands results to asyncio
through futures; Kafka errors are translated to `vqueues.errors` at this edge.
"""

from __future__ import annotations

from typing import Any


def client_config(bootstrap: str, extra: dict[str, str] | None = None,
                  **conf: Any) -> dict[str, Any]:
    """A librdkafka config: bootstrap, our settings, then the user's pass-through options."""
    out: dict[str, Any] = {"bootstrap.servers": bootstrap, "client.dns.lookup": "use_all_dns_ips"}
    out.update(conf)
    out.update(extra or {})
    return out


def poll_batch(consumer: Any, max_messages: int, timeout_s: float) -> list[Any]:
    """Up to `max_messages` messages: wait at most `timeout_s` for the first, then take only what
    is already buffered. (`Consumer.consume(n, t)` waits the whole `t` until it has n.)"""
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    if max_messages <= 1:
        return [first]
    return [first, *consumer.consume(max_messages - 1, 0)]
