"""One vqueues node: Kafka clients, partition ownership, the queue service and the HTTP server,
started and stopped in the right order."""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import threading
from dataclasses import dataclass
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
from vqueues.kafka.partition_reader import PartitionReader
from vqueues.kafka.producer import AsyncProducer
from vqueues.kafka.tail import TopicTail
from vqueues.layouts import Layout, tag, topic_name
from vqueues.ownership import node_status
from vqueues.ownership.adoption import Adoption
from vqueues.ownership.cluster_map import ClusterMap
from vqueues.ownership.listener_slot import ListenerSlot
from vqueues.ownership.ownership import Ownership
from vqueues.ownership.self_fence import SelfFence
from vqueues.queues.layered_fetcher import LayeredFetcher
from vqueues.queues.service import QueueService
from vqueues.settings import Settings
from vqueues.state.cache import RecordCache
from vqueues.storage import GroupListener, Log
from vqueues.upkeep.forwarding import Forwarding
from vqueues.upkeep.layout_cut import LayoutCut
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


@dataclass
class Carried:
    """The next layout's group membership, joined while the node cut its partitions, handed
    to the node it restarts as (ADR 19): the restart then waits for no group join."""

    layout: int
    group: GroupMember
    slot: ListenerSlot
    fence: SelfFence
    cache: RecordCache | None = None

    def stop(self) -> None:
        """Blocking: leave the group unused."""
        self.slot.close()
        self.group.stop()
        self.fence.stop()


class Node:
    """`async with Node(settings) as node:` serves until the block exits."""

    def __init__(self, settings: Settings, carried: Carried | None = None) -> None:
        self.settings = settings
        self._carried = carried
        self.next: Carried | None = None  # joined for the layout this node leaves for
        self._runner: web.AppRunner | None = None
        self._group: GroupMember | None = None
        self._producers: list[AsyncProducer] = []
        self._fetchers: list[Fetcher] = []
        self.layout = Layout(0, 0)
        self._data_log: Log | None = None
        self._cache: RecordCache | None = None
        self._marker_log: Log | None = None
        self._embedded = self._static = False
        self._cut: LayoutCut | None = None
        self._forwarding: Forwarding | None = None
        # Set once the layout this node leaves is cut everywhere: `vqueues serve` then stops
        # the node and starts it again on the new layout.
        self.restart = asyncio.Event()
        # Set when the process is asked to stop while `start` waits for missing topics: the
        # wait (in a thread) ends at once rather than after `topic_wait_ms`.
        self.abandoned = threading.Event()
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
        # Layout 0's topics first: they stay after a growth, and the layouts are read from
        # the assignment topic, which must exist.
        wait_s = s.topic_wait_ms / 1000  # topics created a moment before may be listed late
        first = await asyncio.to_thread(
            topics.check, admin, s.data_topic, s.offset_topic, s.assignment_topic, wait_s,
            stopped=self.abandoned)
        layouts, leaving, announced = await asyncio.to_thread(self._layouts, first)
        layout = self.layout = layouts[-1]
        data_topic, offset_topic, snapshot_topic = layout.topics(
            s.data_topic, s.offset_topic, s.snapshot_topic)
        partitions = (await asyncio.to_thread(
            topics.check, admin, data_topic, offset_topic, s.assignment_topic, wait_s,
            stopped=self.abandoned)
            if layout.number else first)
        if layout.number and partitions != layout.partitions:
            raise ConfigError(
                f"layout {layout.number} has {layout.partitions} partitions but its data topic "
                f"{data_topic!r} has {partitions}")
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
        # The node this one restarts from hands its cache over: the records it cached stay
        # where they are, read now as the adopted queues' older records (ADR 19).
        cache = (self._carried.cache if self._carried is not None
                 and self._carried.cache is not None else RecordCache(s.cache_max_bytes))
        self._cache = cache
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
        carried, self._carried = self._carried, None
        if carried is not None and carried.layout != layout.number:
            await asyncio.to_thread(carried.stop)
            carried = None
        self._embedded, self._static = embedded, static
        self._fence = carried.fence if carried is not None else self._new_fence()
        self.ownership = Ownership(
            loop, partitions, cache, offset_log,
            node_id=s.effective_node_id, url=s.effective_url, cluster_map=cluster_map,
            assignment_log=TopicLog(offsets, s.assignment_topic), snapshot_log=snapshot_log,
            idempotency_window_ms=s.idempotency_window_ms, fence=self._fence)
        if layout.number and announced.all_cut(layout.number):
            before = layouts[-2]
            self.ownership.adoption = Adoption(
                layout, before, dict(announced.cuts[layout.number]),
                KafkaOffsetLog(offsets, before.topics("", "", s.snapshot_topic)[2],
                               reader_conf))
            old_data = before.topics(s.data_topic, "", "")[0]
            forward_group = f"{group_id(s.group_id, layout.number)}.forward"

            def open_reader(child: int) -> PartitionReader:
                return PartitionReader(reader_conf, old_data, layout.parent(child, before),
                                       f"{forward_group}-{child}")
        cluster_map.cuts.update(announced.cuts)
        self._tail = TopicTail(
            self._conf(**{"group.id": f"vq-map-{s.effective_node_id}",
                          "fetch.wait.max.ms": s.fetch_wait_max_ms}),
            s.assignment_topic, 1,
            lambda batch: loop.call_soon_threadsafe(self._assignments, batch))
        self._tail.start()
        data_log = (TaggedTopicLog(data, data_topic, tag(layout.number, 0)) if layout.number
                    else TopicLog(data, data_topic))
        self.service = QueueService(s, self.ownership, cache, data_log, offset_log, fetcher,
                                    fetcher.home if layout.number else None)
        node_status.register_gauges(self.ownership)
        self.ownership.metrics.counters(
            "vq_produce_requests", "produce requests the node's producers sent (librdkafka's "
            "statistics, at most 1 s old), by topic: data (enqueues) and offsets (offset, "
            "snapshot and assignment topics)", "topic",
            lambda: {"data": data.produce_requests, "offsets": offsets.produce_requests})
        if carried is not None:
            self._group = carried.group
            carried.slot.attach(self.ownership)
        else:
            self._group = self._new_group(layout.number, data_topic, self.ownership,
                                          self._fence)
            self._group.start()
        group = self._group
        self.ownership.metrics.counters(
            "vq_tail_pauses", "times the data topic's tail paused for tail_pace_ms after a "
            "fetch that brought only this node's own writes", "topic",
            lambda: {"data": group.pauses})
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
        self._data_log = data_log
        # The cut's marker must have a known offset whatever `producer_acks` says (ADR 19).
        self._marker_log = (TaggedTopicLog(offsets, data_topic, tag(layout.number, 0))
                            if layout.number else TopicLog(offsets, data_topic))
        if self.ownership.adoption is not None:
            forwarding = self._forwarding = Forwarding(
                self.ownership, self.service, self.ownership.adoption, open_reader)
            forwarding.start()
            self.ownership.metrics.counters(
                "vq_late_records_forwarded", "records that reached the previous layout's data "
                "topic after its cut, forwarded to this layout by this node (ADR 19)",
                "layout", lambda: {str(layout.number - 1): forwarding.forwarded})
        if leaving is not None:
            self._leave(leaving)
        self._follow_layouts()

    def _new_fence(self) -> SelfFence:
        s = self.settings
        fence = SelfFence(s.self_fence_ms / 1000 if s.self_fence_ms else math.inf)
        if s.self_fence_ms:
            fence.start()
        return fence

    def _new_group(self, layout: int, data_topic: str, listener: GroupListener,
                   fence: SelfFence) -> GroupMember:
        s = self.settings
        return GroupMember(self._conf(**{
            "group.id": group_id(s.group_id, layout),
            "session.timeout.ms": s.session_timeout_ms,
            "heartbeat.interval.ms": s.heartbeat_interval_ms,
            "fetch.wait.max.ms": s.fetch_wait_max_ms,
            **({"group.instance.id": s.effective_node_id} if self._static else {})}),
            data_topic, listener, fence=fence, pace_ms=s.tail_pace(self._embedded),
            offset_base=tag(layout, 0))

    def take_next(self) -> Carried | None:
        """The next layout's membership, for the node this one restarts as."""
        carried, self.next = self.next, None
        if carried is not None:
            carried.cache = self._cache
        return carried

    def _read_map(self) -> ClusterMap:
        """Blocking: the assignment topic read to its end, as a map holding every layout
        and cut it announces."""
        s = self.settings
        conf = self._conf(**{"group.id": f"vq-layouts-{s.effective_node_id}"})
        entries, _end = read_to_end(conf, s.assignment_topic, [0])[0]
        found = ClusterMap(0)
        found.apply([(k, v) for k, v, _h in entries])
        return found

    def _layouts(self, first: int) -> tuple[list[Layout], int | None, ClusterMap]:
        """Blocking: the layouts up to the one to serve, oldest first (layout 0 with `first`
        partitions, its data topic's count as `start` checked it), and the layout this node is
        leaving for, if it must first cut the one it serves (ADR 19). A newer layout is served
        once every partition of the one before is cut for it."""
        announced = self._read_map()
        announced.layouts[0] = Layout(0, first)  # layout 0's count is its data topic's
        layouts = [announced.layouts[n] for n in sorted(announced.layouts)]
        newest = layouts[-1]
        if newest.number == 0 or announced.all_cut(newest.number):
            return layouts, None, announced
        # Even a layout that looks empty is cut: it may hold queues adopted from the one before
        # whose records are all still in that one's topics.
        return layouts[:-1], newest.number, announced

    def cut_for(self, layout: int, partition: int) -> bool:
        """Blocking: whether the assignment topic holds a cut of `partition` for `layout`."""
        return partition in self._read_map().cuts.get(layout, {})

    def _assignments(self, batch: list[tuple[bytes | None, bytes | None]]) -> None:
        """The assignment topic's records: the cluster map and the prefix consumers."""
        assert self.ownership is not None
        self.ownership.cluster_map.apply(batch)
        self.ownership.prefixes.apply(batch)
        self._follow_layouts()

    def _follow_layouts(self) -> None:
        """A newer layout announced: cut this node's partitions for it; once every partition
        is cut (by whichever node), restart on it (ADR 19)."""
        if self.ownership is None or self._data_log is None:
            return
        cmap = self.ownership.cluster_map
        if self._cut is None and max(cmap.layouts) > self.layout.number:
            self._leave(self.layout.number + 1)
        if self._cut is not None and cmap.all_cut(self._cut.to) and not self.restart.is_set():
            log.info("layout_cut", extra={"layout": self._cut.to,
                                          "restarting_on_it": self.settings.effective_node_id})
            self.restart.set()

    def _leave(self, to: int) -> None:
        assert self.ownership is not None and self._upkeep is not None
        assert self._marker_log is not None
        log.info("layout_leaving", extra={"layout": self.layout.number, "for": to})
        # Join the next layout's group first: its first join takes seconds (half the session
        # timeout on the embedded broker), during which the partitions still serve; the cut
        # follows, and the restart after it then waits for no join.
        s = self.settings
        slot, fence = ListenerSlot(), self._new_fence()
        group = self._new_group(to, topic_name(s.data_topic, to), slot, fence)
        group.start()
        self.next = Carried(to, group, slot, fence)
        self._cut = LayoutCut(self.ownership, self._marker_log, self._upkeep, to,
                              lambda p: self.cut_for(to, p), slot.joined,
                              s.session_timeout_ms / 1000)
        self._cut.start()

    async def stop(self) -> None:
        """Stop taking requests, finish those in flight, release the partitions and leave the
        group (so they move at once), then flush the producers."""
        for task in self._maintenance:
            task.cancel()
        await self._stop_growth()
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
        for unused in (self.next, self._carried):  # joined, never handed over or taken
            if unused is not None:
                await asyncio.to_thread(unused.stop)
        self.next = self._carried = None
        if self.ownership is not None:
            await self.ownership.close()
        if self.service is not None:
            await asyncio.to_thread(self.service.close)
        for p in self._producers:
            await asyncio.to_thread(p.close)
        for fetcher in self._fetchers:
            await asyncio.to_thread(fetcher.close)
        log.info("node_stopped", extra={"node": self.settings.effective_node_id})

    async def _stop_growth(self) -> None:
        """Stop cutting and forwarding (ADR 19): what is not done is the next owner's."""
        if self._cut is not None:
            await self._cut.close()
        if self._forwarding is not None:
            await self._forwarding.close()

    async def __aenter__(self) -> Node:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
