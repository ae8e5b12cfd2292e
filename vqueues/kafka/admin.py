"""Topic administration through confluent-kafka's AdminClient."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from vqueues.kafka import kafka_errors, translate


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replication_factor: int = -1  # -1: the broker's default
    config: dict[str, str] = field(default_factory=dict)


class Admin:
    def __init__(self, conf: dict[str, Any]) -> None:
        self._admin = AdminClient(conf)

    def create(self, specs: Sequence[TopicSpec], timeout_s: float = 30.0) -> dict[str, str]:
        """Create topics; returns name -> "created" or "exists". Other failures raise."""
        new = [NewTopic(s.name, num_partitions=s.partitions,
                        replication_factor=s.replication_factor, config=dict(s.config))
               for s in specs]
        outcome: dict[str, str] = {}
        for name, fut in self._admin.create_topics(new, request_timeout=timeout_s).items():
            try:
                fut.result(timeout_s)
                outcome[name] = "created"
            except KafkaException as exc:
                err: KafkaError = exc.args[0]
                if err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    outcome[name] = "exists"
                else:
                    raise translate(err, f"creating {name}") from None
        return outcome

    def _listed(self, topics: Sequence[str], timeout_s: float) -> dict[str, dict[int, Any]]:
        """Each topic's partitions (number -> metadata); {} where the topic does not exist."""
        with kafka_errors("listing topics"):
            md = self._admin.list_topics(timeout=timeout_s)
        out: dict[str, dict[int, Any]] = {}
        for t in topics:
            tm = md.topics.get(t)
            out[t] = {} if tm is None or tm.error is not None else dict(tm.partitions)
        return out

    def partition_counts(self, topics: Sequence[str], timeout_s: float = 10.0
                         ) -> dict[str, int | None]:
        """Partition count of each topic; None where the topic does not exist."""
        return {t: len(parts) or None for t, parts in self._listed(topics, timeout_s).items()}

    def replication_factors(self, topics: Sequence[str], timeout_s: float = 10.0
                            ) -> dict[str, int | None]:
        """Each topic's replica count (its first partition's); None where it does not exist."""
        return {t: len(parts[min(parts)].replicas) if parts else None
                for t, parts in self._listed(topics, timeout_s).items()}

    def topic_configs(self, topics: Sequence[str], keys: Sequence[str], timeout_s: float = 10.0
                      ) -> dict[str, dict[str, str]]:
        """Each topic's current value of `keys` (its own or the broker's default; a key the
        broker does not report is left out)."""
        resources = [ConfigResource(ResourceType.TOPIC, t) for t in topics]
        out: dict[str, dict[str, str]] = {}
        with kafka_errors("describing topic configs"):
            for res, fut in self._admin.describe_configs(
                    resources, request_timeout=timeout_s).items():
                entries = fut.result(timeout_s)
                out[res.name] = {k: str(entries[k].value) for k in keys
                                 if k in entries and entries[k].value is not None}
        return out

    def set_topic_configs(self, topic: str, config: Mapping[str, str],
                          timeout_s: float = 30.0) -> None:
        """Set these keys of a topic's config, leaving its other keys as they are."""
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
            ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET)
            for k, v in config.items()])
        with kafka_errors(f"setting {topic}'s config"):
            for fut in self._admin.incremental_alter_configs(
                    [resource], request_timeout=timeout_s).values():
                fut.result(timeout_s)

    def cluster_id(self, timeout_s: float = 10.0) -> str:
        """The cluster's id, from its metadata ("" if the broker gives none)."""
        with kafka_errors("reading cluster metadata"):
            return str(self._admin.list_topics(timeout=timeout_s).cluster_id or "")

    def delete(self, topics: Sequence[str], timeout_s: float = 30.0) -> None:
        with kafka_errors("deleting topics"):
            for fut in self._admin.delete_topics(list(topics), request_timeout=timeout_s).values():
                fut.result(timeout_s)
