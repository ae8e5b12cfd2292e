"""What a node tells about itself: its partitions and the cluster map (`GET /v1/partitions`,
`/readyz`), and the gauges `/metrics` reads."""

from __future__ import annotations

from vqueues import memory
from vqueues.ownership.ownership import Ownership
from vqueues.results import NodeLimits, OwnerInfo, PartitionDetail, PartitionsInfo
from vqueues.settings import Settings


def partitions_info(ownership: Ownership, settings: Settings) -> PartitionsInfo:
    """The cluster map, this node's partitions, and the limits a client sizes requests by."""
    states = ownership.states
    cmap = ownership.cluster_map
    return PartitionsInfo(
        partitions=cmap.partitions, generation=cmap.generation,
        owners={str(p): OwnerInfo(o.node, o.url) for p, o in sorted(cmap.owners.items())},
        node=ownership.node_id, url=ownership.url,
        owned=sorted(states), ready=sorted(p for p, s in states.items() if s.ready.is_set()),
        limits=NodeLimits(settings.max_body_bytes, settings.max_batch_records,
                          settings.max_record_bytes),
        details=[PartitionDetail(p, s.ready.is_set(), len(s.queues), s.log_start,
                                 s.tail_offset, s.replay_target)
                 for p, s in sorted(states.items())],
        layout=cmap.layout)


def register_gauges(ownership: Ownership) -> None:
    states, cache, m = ownership.states, ownership.cache, ownership.metrics
    m.gauge("vq_partitions_owned", "partitions this node owns", lambda: len(states))
    m.gauge("vq_partitions_ready", "owned partitions that finished replay",
            lambda: sum(1 for s in states.values() if s.ready.is_set()))
    m.gauge("vq_queues", "queues held in the owned partitions",
            lambda: sum(len(s.queues) for s in states.values()))
    m.gauge("vq_cache_bytes", "recent-record cache size", lambda: cache.bytes)
    m.gauge("vq_cache_records", "records in the recent-record cache", lambda: len(cache))
    m.gauge("vq_cluster_generation", "highest generation in the cluster map",
            lambda: ownership.cluster_map.generation)
    m.gauge("vq_heap_in_use_bytes", "memory the C allocator has handed out (live), beside "
            "process_resident_memory_bytes", memory.heap_in_use)
