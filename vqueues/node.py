"""One vqueues node: Kafka clients, partition ownership, the queue service and the HTTP server,
started and stopped in the right order."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
from typing import Any

from aiohttp import web

from vqueues import memory
from vqueues.api.app import create_app
from vqueues.api.keys import WORK
from vqueues.errors import ConfigError
from vqueues.kafka import client_config, topics
from vqueues.kafka.admin import Admin
from vqueues.kafka.fetcher import Fetcher
from vqueues.kafka.group import GroupMember
from vqueues.kafka.logs import KafkaOffsetLog, TaggedTopicLog, TopicLog, read_to_end
from vqueues.kafka.producer import AsyncProducer
from vqueues.kafka.ranges import holds_records
from vqueues.kafka.tail import TopicTail
from vqueues.layouts import Layout, decode_layout, tag
from vqueues.ownership import node_status
from vqueues.ownership.cluster_map import ClusterMap
from vqueues.ownership.ownership import Ownership
from vqueues.ownership.self_fence import SelfFence
from vqueues.queues.layered_fetcher import LayeredFetcher
from vqueues.queues.service import QueueService
from vqueues.settings import Settings
from vqueues.state.cache import RecordCache
from vqueues.upkeep.lease_expiry import LeaseExpiry
from vqueues.upkeep.maintenance import Maintenance
from vqueues.upkeep.scheduler import Scheduler

log = logging.getLogger(__name__)

# The embedded broker's cluster id: its group coordinator does not give a static member that
# restarts its partitions back (ADR 15), so "auto" stays dynamic.
EMBEDDED_CLUSTER_ID = "tansu_cluster"
# A stopping node snapshots the partitions that changed this much since their last snapshot,
# within this time (settings.snapshot_on_stop).
SNAPSHOT_AT_STOP_MIN_RECORDS = 1000
SNAPSHOT_AT_STOP_TIMEOUT_S = 10.0


def group_id(base: str, layout: int) -> str:
    """The consumer group of a layout's data topic: one group per layout (ADR 19)."""
    return f"{base}.l{layout}" if layout else base


class Node:
    """`async with Node(settings) as node:` serves until the block exits."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._runner: web.AppRunner | None = None
        self._group: GroupMember | None = None
        self._producers: list[AsyncProducer] = []
        self._fetchers: list[Fetcher] = []
        self.layout = Layout(0, 0)
        self._tail: TopicTail | None = None
        self._fence: SelfFence | None = None
        self.service: QueueService | None = None
        self._maintenance: list[asyncio.Task[None]] = []
        self._upkeep: Maintenance | None = None
        self.ownership: Ownership | None = None
        # On the embedded broker, one broker: any dropped connection loses every broker at once,
        # and librdkafka's default re-bootstrap then forgets it and learns it again, which
        # stalls every write (ADR 15). On a cluster the default stays: it lets a node serve
        # again after all the brokers restarted (tests/test_kafka_faults.py).
        self._single_broker: dict[str, str] = {}

    def _conf(self, **conf: Any) -> dict[str, Any]:
        s = self.settings
        return client_config(s.bootstrap, s.kafka_extra(),
                             **{"client.id": f"vqueues-{s.effective_node_id}",
                                **self._single_broker, **conf})

    async def start(self) -> None:
        s = self.settings
        loop = asyncio.get_running_loop()
        admin = Admin(self._conf())
        layouts = await asyncio.to_thread(self._layouts)
        layout = self.layout = layouts[-1]
        data_topic, offset_topic, snapshot_topic = layout.topics(
            s.data_topic, s.offset_topic, s.snapshot_topic)
        partitions = await asyncio.to_thread(
            topics.check, admin, data_topic, offset_topic, s.assignment_topic)
        if layout.number and partitions != layout.partitions:
            raise ConfigError(
                f"layout {layout.number} has {layout.partitions} partitions but its data topic "
                f"{data_topic!r} has {partitions}")
        first = (await asyncio.to_thread(topics.check, admin, s.data_topic, s.offset_topic,
                                         s.assignment_topic) if layout.number else partitions)
        layouts[0] = Layout(0, first)
        if not layout.number:
            layout = self.layout = layouts[0]
        embedded = await asyncio.to_thread(admin.cluster_id) == EMBEDDED_CLUSTER_ID
        static = s.static_membership == "on" or (s.static_membership == "auto" and not embedded)
        if embedded:
            self._single_broker = {"metadata.recovery.strategy": "none"}
        with_snapshots = await asyncio.to_thread(topics.check_snapshots, admin, snapshot_topic,
                                                 partitions)
        if not with_snapshots:
            log.warning("snapshots_disabled", extra={
                "snapshot_topic": snapshot_topic,
                "why": "the topic does not exist; `vqueues topics create` makes it"})
        cache = RecordCache(s.cache_max_bytes)
        data = AsyncProducer(self._conf(**{
            "acks": s.producer_acks, "enable.idempotence": s.producer_acks == "all",
            "linger.ms": s.producer_linger_ms, "partitioner": "murmur2",
            "compression.type": "lz4", "message.timeout.ms": s.broker_timeout_ms}), "data",
            busy_linger_ms=s.busy_linger_ms(embedded))
        offsets = AsyncProducer(self._conf(**{
            "acks": "all", "enable.idempotence": True, "linger.ms": 0,
            "message.timeout.ms": s.broker_timeout_ms}), "offsets")
        self._producers = [data, offsets]
        reader_conf = self._conf(**{"group.id": f"vq-reader-{s.effective_node_id}",
                                    "fetch.wait.max.ms": s.fetch_wait_max_ms})
        # Records of earlier layouts stay where they were written (ADR 19): one fetcher per
        # layout's data topic, the older ones small.
        fetchers: dict[int, tuple[Layout, Fetcher]] = {}
        for known in layouts:
            fetchers[known.number] = (known, Fetcher(
                reader_conf, known.topics(s.data_topic, "", "")[0],
                s.fetchers if known is layout else 1, s.broker_timeout_ms / 1000,
                offset_base=tag(known.number, 0)))
        self._fetchers = [f for _, f in fetchers.values()]
        fetcher = LayeredFetcher(dict(fetchers), layout.number)
        cluster_map = ClusterMap(partitions, layout.number)
        cluster_map.layouts.update({known.number: known for known in layouts})
        offset_log = KafkaOffsetLog(offsets, offset_topic, reader_conf)
        snapshot_log = (KafkaOffsetLog(offsets, snapshot_topic, reader_conf)
                        if with_snapshots else None)
        self._fence = SelfFence(s.self_fence_ms / 1000 if s.self_fence_ms else math.inf)
        if s.self_fence_ms:
            self._fence.start()
        self.ownership = Ownership(
            loop, partitions, cache, offset_log,
            node_id=s.effective_node_id, url=s.effective_url, cluster_map=cluster_map,
            assignment_log=TopicLog(offsets, s.assignment_topic), snapshot_log=snapshot_log,
            idempotency_window_ms=s.idempotency_window_ms, fence=self._fence)
        self._tail = TopicTail(
            self._conf(**{"group.id": f"vq-map-{s.effective_node_id}",
                          "fetch.wait.max.ms": s.fetch_wait_max_ms}),
            s.assignment_topic, 1,
            lambda batch: loop.call_soon_threadsafe(self._assignments, batch))
        self._tail.start()
        data_log = (TaggedTopicLog(data, data_topic, tag(layout.number, 0)) if layout.number
                    else TopicLog(data, data_topic))
        self.service = QueueService(s, self.ownership, cache, data_log, offset_log, fetcher)
        node_status.register_gauges(self.ownership)
        self.ownership.metrics.counters(
            "vq_produce_requests", "produce requests the node's producers sent (librdkafka's "
            "statistics, at most 1 s old), by topic: data (enqueues) and offsets (offset, "
            "snapshot and assignment topics)", "topic",
            lambda: {"data": data.produce_requests, "offsets": offsets.produce_requests})
        self._group = GroupMember(self._conf(**{
            "group.id": group_id(s.group_id, layout.number),
            "session.timeout.ms": s.session_timeout_ms,
            "heartbeat.interval.ms": s.heartbeat_interval_ms,
            "fetch.wait.max.ms": s.fetch_wait_max_ms,
            **({"group.instance.id": s.effective_node_id} if static else {})}),
            data_topic, self.ownership, fence=self._fence, pace_ms=s.tail_pace(embedded),
            offset_base=tag(layout.number, 0))
        group = self._group
        self.ownership.metrics.counters(
            "vq_tail_pauses", "times the data topic's tail paused for tail_pace_ms after a "
            "fetch that brought only this node's own writes", "topic",
            lambda: {"data": group.pauses})
        self._group.start()
        self._upkeep = Maintenance(s, self.ownership, self.service, snapshot_log)
        self._maintenance = self._upkeep.start()
        self._maintenance.append(asyncio.create_task(
            Scheduler(self.service, self.ownership, s.scheduler_tick_ms).run_forever()))
        app = create_app(self.service, s)
        self._maintenance.append(asyncio.create_task(
            LeaseExpiry(app[WORK], self.ownership, s.scheduler_tick_ms).run_forever()))
        # auto_decompress off: request bodies are decoded by the handlers (api/body.py), so that
        # a broken gzip body gets the node's JSON error, not the HTTP parser's plain text.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=10.0,
                                     auto_decompress=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, s.http_host, s.http_port,
                          ssl_context=s.ssl_context()).start()
        # Collections of the young generation cost per request under load; what exists now
        # (modules, settings, clients) lives as long as the process: keep it out of them.
        gc.set_threshold(s.gc_young_threshold, *gc.get_threshold()[1:])
        gc.freeze()
        memory.GcPauses().install()
        log.info("node_started", extra={"node": s.effective_node_id, "url": s.effective_url,
                                        "bootstrap": s.bootstrap, "partitions": partitions,
                                        "layout": layout.number,
                                        "static_membership": static})

    def _layouts(self) -> list[Layout]:
        """Blocking: the layouts the assignment topic announces, oldest first (layout 0's
        partition count is left 0: its data topic says it)."""
        s = self.settings
        conf = self._conf(**{"group.id": f"vq-layouts-{s.effective_node_id}"})
        entries, _end = read_to_end(conf, s.assignment_topic, [0])[0]
        found = {0: Layout(0, 0)}
        for key, value, _headers in entries:
            announced = decode_layout(key, value)
            if announced is not None:
                found[announced.number] = announced
        layouts = [found[n] for n in sorted(found)]
        # A child takes its queues over from its parent's final snapshot (ADR 19), which this
        # version does not write yet: a layout whose predecessor holds records is not followed,
        # so that no record, position or lease goes out of sight.
        while len(layouts) > 1:
            before = layouts[-2]
            old_data = before.topics(s.data_topic, "", "")[0]
            if not holds_records(self._conf(**{"group.id": f"vq-layouts-{s.effective_node_id}"}),
                                 old_data):
                break
            log.warning("layout_not_followed", extra={
                "layout": layouts[-1].number, "serving": before.number,
                "why": f"{old_data!r} holds records, and this version does not carry them "
                       f"over to a new layout"})
            layouts.pop()
        return layouts

    def _assignments(self, batch: list[tuple[bytes | None, bytes | None]]) -> None:
        """The assignment topic's records: the cluster map and the prefix consumers."""
        assert self.ownership is not None
        self.ownership.cluster_map.apply(batch)
        self.ownership.prefixes.apply(batch)

    async def stop(self) -> None:
        """Stop taking requests, finish those in flight, release the partitions and leave the
        group (so they move at once), then flush the producers."""
        for task in self._maintenance:
            task.cancel()
        if self.ownership is not None:
            self.ownership.drain()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._upkeep is not None and self.settings.snapshot_on_stop:
            # No request is served any more: the snapshots hold everything answered.
            written = await self._upkeep.snapshot_changed(SNAPSHOT_AT_STOP_MIN_RECORDS,
                                                          SNAPSHOT_AT_STOP_TIMEOUT_S)
            log.info("snapshots_at_stop", extra={"written": written})
        if self._group is not None:
            # The group thread reports revocations to the loop: never block the loop on it.
            await asyncio.to_thread(self._group.stop)
        if self._tail is not None:
            await asyncio.to_thread(self._tail.stop)
        if self._fence is not None:
            self._fence.stop()
        if self.ownership is not None:
            await self.ownership.close()
        if self.service is not None:
            await asyncio.to_thread(self.service.close)
        for p in self._producers:
            await asyncio.to_thread(p.close)
        for fetcher in self._fetchers:
            await asyncio.to_thread(fetcher.close)
        log.info("node_stopped", extra={"node": self.settings.effective_node_id})

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
