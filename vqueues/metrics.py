"""Prometheus metrics of one node, served at GET /metrics (prometheus-client, a registry each).

Counters move where the work happens (service, ownership); gauges are read when scraped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30)


class Metrics:

    def of_request(self, route: str, method: str, status: int) -> tuple[Counter, Histogram]:
        """The request counter and timer of a route template, method and status: looked up
        once (`labels` builds and locks each time; a few routes and statuses make few)."""
        key = (route, method, status)
        found = self._of_request.get(key)
        if found is None:
            found = self._of_request[key] = (
                self.requests.labels(route, method, str(status)),
                self.request_seconds.labels(route, method))
        return found
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, CPU seconds, ...
        self.requests = Counter("vq_http_requests", "HTTP requests answered",
                                ["route", "method", "status"], registry=r)
        self.request_seconds = Histogram("vq_http_request_seconds", "HTTP request latency",
                                         ["route", "method"], buckets=LATENCY_BUCKETS,
                                         registry=r)
        self._of_request: dict[tuple[str, str, int], tuple[Counter, Histogram]] = {}
        self.records_enqueued = Counter("vq_records_enqueued", "records written by enqueue",
                                        registry=r)
        self.records_read = Counter("vq_records_read", "records returned by reads", registry=r)
        self.acks = Counter("vq_acks", "consumer offsets committed", registry=r)
        self.records_leased = Counter("vq_records_leased", "records handed out by leases",
                                      registry=r)
        self.records_completed = Counter("vq_records_completed", "leased records completed",
                                         registry=r)
        self.records_retried = Counter("vq_records_retried", "leased records given back by "
                                       "retry", registry=r)
        self.grant_writes_failed = Counter(
            "vq_grant_writes_failed", "lease calls whose grants, written behind the answer, "
            "failed to be written (a new owner may lease those records again early)",
            registry=r)
        self.records_dead_lettered = Counter(
            "vq_records_dead_lettered", "records past max_attempts, sent to the dead-letter "
            "queue (or marked failed)", registry=r)
        self.records_scheduled_moved = Counter(
            "vq_records_scheduled_moved", "scheduled records moved into their queues at their "
            "due time", registry=r)
        self.quota_refusals = Counter(
            "vq_quota_refusals", "enqueues refused with 429 by a tenant's quota, by quota prefix",
            ["prefix"], registry=r)
        self.queues_deleted = Counter("vq_queues_deleted", "queues deleted", registry=r)
        self.snapshots = Counter("vq_snapshots", "partition snapshots written", registry=r)
        self.consumers_expired = Counter(
            "vq_consumers_expired", "consumers removed after consumer_retention_ms without an ack",
            registry=r)
        self.records_skipped = Counter(
            "vq_records_skipped", "data records not indexed (no key, or another partitioner "
            "put them in a partition their queue does not route to)", registry=r)
        self.replay_seconds = Histogram(
            "vq_partition_replay_seconds", "time from assignment to a partition being ready",
            buckets=(.1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300), registry=r)
        self.rebalances = Counter("vq_partitions_assigned", "partitions assigned to this node",
                                  registry=r)
        self.loop_lag = Histogram(
            "vq_event_loop_lag_seconds", "how late the event loop ran a timer sampled every "
            "50 ms (a blocked loop delays every request by as much)",
            buckets=(.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5), registry=r)
        self.loop_lag_max = Gauge("vq_event_loop_lag_max_seconds",
                                  "the worst vq_event_loop_lag_seconds since the node started",
                                  registry=r)
        self._loop_lag_max = 0.0
        self.revocations = Counter("vq_partitions_revoked", "partitions taken from this node",
                                   ["lost"], registry=r)

        # The consumers furthest behind (lag, queue, consumer), set by the maintenance pass.
        self.lag_source: Callable[[], list[tuple[int, str, str]]] = list
        r.register(_TopLags(self))

    def observe_loop_lag(self, seconds: float) -> None:
        self.loop_lag.observe(seconds)
        if seconds > self._loop_lag_max:
            self._loop_lag_max = seconds
            self.loop_lag_max.set(seconds)

    def gauge(self, name: str, doc: str, read: Callable[[], float]) -> None:
        """A gauge whose value is read at scrape time."""
        Gauge(name, doc, registry=self.registry).set_function(read)

    def counters(self, name: str, doc: str, label: str,
                 read: Callable[[], dict[str, float]]) -> None:
        """A counter kept elsewhere (librdkafka's statistics), one per `label` value, read at
        scrape time."""
        self.registry.register(_ReadCounters(name, doc, label, read))


class _ReadCounters(Collector):
    def __init__(self, name: str, doc: str, label: str,
                 read: Callable[[], dict[str, float]]) -> None:
        self.name, self.doc, self.label, self.read = name, doc, label, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self.name, self.doc, labels=[self.label])
        for value, count in self.read().items():
            family.add_metric([value], count)
        yield family


class _TopLags(Collector):
    """`vq_consumer_lag_top{queue,consumer}`: the few consumers furthest behind on this node (a
    bounded label set, refreshed every retention_check_s), for dashboards and alerts."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "vq_consumer_lag_top", "records behind, for the consumers furthest behind on this "
            "node (refreshed every retention_check_s)", labels=["queue", "consumer"])
        for lag, queue, consumer in self.metrics.lag_source():
            family.add_metric([queue, consumer], lag)
        yield family
