"""Retention and idle consumers: the index follows the data partition's log start, and a node
that has run for a long time holds exactly the state a freshly replayed node builds."""

import asyncio
import random
import sys
from typing import Any

import pytest

from tests.narrow import known
from tests.unit.partitions import history, observe, rec
from vqueues.records import ConsumerAcked, ConsumerDeleted, QueueDeleted, now_ms
from vqueues.state import committed_offsets
from vqueues.state.cache import RecordCache
from vqueues.state.partition_state import PartitionState
from vqueues.upkeep.maintenance import Maintenance


async def test_trimming_drops_records_below_the_log_start_and_empty_queues_leave():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("a", rec(0)), ("b", rec(1)), ("a", rec(2)), ("c", rec(3))], None)
    s.apply_offset_entries([ConsumerAcked("b", "keeper", 0, 1)])
    s.trim(2, list(s.queues))
    assert s.select("a", 0, 10) == [2]
    assert known(s.stats("a")).records == 1 and known(s.stats("a")).first_offset == 2
    assert "b" in s.queues and known(s.stats("b")).records == 0  # its consumer keeps it listed
    assert known(s.stats("b")).consumers == {"keeper": (0, 0)}  # lag counts retained records only
    s.apply_offset_entries([ConsumerDeleted("b", "keeper")])
    assert "b" not in s.queues and list(s.names) == ["a", "c"]
    s.trim(4, list(s.queues))
    assert s.queues == {} and list(s.names) == []


async def test_a_deletion_marker_stays_while_it_still_hides_retained_records():
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("a", rec(0)), ("a", rec(1))], None)
    s.apply_offset_entries([QueueDeleted("a", 2)])
    s.trim(1, list(s.queues))
    assert "a" in s.queues and s.queues["a"].deleted_before == 2 and list(s.names) == []
    s.trim(2, list(s.queues))
    assert "a" not in s.queues


@pytest.mark.parametrize("seed", range(30))
async def test_a_long_running_node_equals_a_fresh_replay_after_retention(seed):
    events, end = history(seed)
    log_start = random.Random(seed).randrange(end + 1)
    # A node that saw everything as it happened, then retention moved the log start.
    old = PartitionState(0, RecordCache(1 << 20))
    for kind, *rest in events:
        if kind == "data":
            old.apply_records([(rest[0], rec(rest[1]))], None)
        else:
            old.apply_offset_entries(rest)
    old.trim(log_start, list(old.queues))
    # A fresh node: the offset partition's entries, then the data still retained.
    fresh = PartitionState(0, RecordCache(1 << 20))
    fresh.apply_offset_entries([rest[0] for kind, *rest in events if kind == "entry"])
    fresh.apply_records([(e[1], rec(e[2])) for e in events
                         if e[0] == "data" and e[2] >= log_start], None)
    fresh.trim(log_start, list(fresh.queues))
    assert observe(old) == observe(fresh)


async def test_maintenance_follows_retention_and_expires_idle_consumers(service):
    await service.enqueue("r", [(b"1", []), (b"2", []), (b"3", [])])
    await service.ack("r", "idle", 1, allow_rewind=False)
    p = service.partition_of("r")
    service._data.starts[p] = 2  # retention removed offsets 0 and 1
    object.__setattr__(service.settings, "consumer_retention_ms", 0)
    upkeep = Maintenance(service.settings, service.ownership, service)
    await upkeep.follow_retention()
    info = service.queue_info("r")
    assert (info.records, info.first_offset) == (1, 2)
    assert [c.consumer for c in info.consumers] == ["idle"]  # retention 0: kept
    object.__setattr__(service.settings, "consumer_retention_ms", 1)
    await asyncio.sleep(0.01)
    await upkeep.follow_retention()
    assert service.queue_info("r").consumers == []
    assert service._offsets.partitions[p][-1][1] is None  # a tombstone
    service._data.starts[p] = 3
    await upkeep.follow_retention()
    assert service.list_queues("r", None, 10).queues == []


async def test_a_consumer_that_acks_after_the_pass_found_it_idle_is_kept(service):
    await service.enqueue("k", [(b"1", []), (b"2", [])])
    await service.ack("k", "late", 1, allow_rewind=False)
    state = service.ownership.states[service.partition_of("k")]
    await asyncio.sleep(0.01)
    acked_before = now_ms()
    found = committed_offsets.walk([("k", state.queues["k"])], sys.maxsize, acked_before)
    assert found.idle == [("k", "late")]
    expired = service.metrics.registry.get_sample_value("vq_consumers_expired_total")
    # It acks between the pass's scan and its expiry (the pass awaits the offset topic).
    await service.ack("k", "late", 2, allow_rewind=False)
    assert not await service.expire_consumer(state, "k", "late", acked_before)
    assert [c.consumer for c in service.queue_info("k").consumers] == ["late"]
    assert service.metrics.registry.get_sample_value("vq_consumers_expired_total") == expired
    entries = len(service._offsets.partitions[service.partition_of("k")])
    await service.delete_consumer("k", "late")
    assert not await service.expire_consumer(state, "k", "late", now_ms() + 1)  # already gone
    assert len(service._offsets.partitions[service.partition_of("k")]) == entries + 1


async def test_a_pass_walks_every_shard_of_the_queue_map(service):
    names = [f"many/{i}" for i in range(3000)]  # spread over the map's 256 shards
    for name in names:
        await service.ack(name, "c", 0, allow_rewind=False)
    object.__setattr__(service.settings, "consumer_retention_ms", 1)
    await asyncio.sleep(0.01)
    await Maintenance(service.settings, service.ownership, service).follow_retention()
    assert service.list_queues("many/", None, 10).queues == []
    assert service.metrics.registry.get_sample_value("vq_consumers_expired_total") == 3000


async def test_idle_consumers_expired_together_share_offset_topic_writes(service):
    """One consumer after the other, each tombstone waited for a write of its own; expired
    together, a partition's tombstones share writes (`OffsetWriter`)."""
    p = service.partition_of("idle/0")
    names = [q for q in (f"idle/{i}" for i in range(3000)) if service.partition_of(q) == p][:40]
    assert len(names) == 40
    for name in names:
        await service.ack(name, "c", 0, allow_rewind=False)
    object.__setattr__(service.settings, "consumer_retention_ms", 1)
    await asyncio.sleep(0.01)
    writes = service.entries.writes
    await Maintenance(service.settings, service.ownership, service).follow_retention()
    assert service.list_queues("idle/", None, 100).queues == []
    assert service.metrics.registry.get_sample_value("vq_consumers_expired_total") == 40
    assert service.entries.writes - writes <= 2  # the first alone, the rest together


async def test_listings_follow_deletions_and_page_across_partitions(service):
    names = [f"l/{i:03}" for i in range(40)]
    for n in names:
        await service.enqueue(n, [(b"x", [])])
    await service.delete_queue("l/005")
    got, after = [], None
    while True:
        page = service.list_queues("l/", after, 7)
        got += page.queues
        if page.next_after is None:
            break
        after = page.next_after
    assert got == [n for n in names if n != "l/005"]
    await service.enqueue("l/005", [(b"again", [])])
    assert "l/005" in service.list_queues("l/", "l/004", 1).queues


async def test_a_pass_walks_only_for_what_can_have_changed(service, monkeypatch):
    """With the log start where it was and no consumer near the retention, a pass trims
    nothing and looks for no idle consumer (100,000 prefix-leased queues cost 440 ms of
    the loop a pass); each walk comes back once it can find something."""
    await service.enqueue("w", [(b"1", []), (b"2", []), (b"3", [])])
    await service.ack("w", "c", 1, allow_rewind=False)
    p = service.partition_of("w")
    state = service.ownership.states[p]
    object.__setattr__(service.settings, "consumer_retention_ms", 60_000)
    upkeep = Maintenance(service.settings, service.ownership, service)
    trims: list[tuple[Any, ...]] = []
    walks: list[int | None] = []
    trim, walk = state.trim, state.consumers_in_shard

    def trim_noted(*a):
        trims.append(a)
        return trim(*a)

    def walk_noted(shard, above, before):
        walks.append(before)
        return walk(shard, above, before)

    monkeypatch.setattr(state, "trim", trim_noted)
    monkeypatch.setattr(state, "consumers_in_shard", walk_noted)
    await upkeep.follow_retention()
    assert trims and any(b is not None for b in walks)  # the first pass walks for both
    trims.clear()
    walks.clear()
    await upkeep.follow_retention()
    assert not trims and walks and all(b is None for b in walks)  # lags only
    assert upkeep.top_lags == [(2, "w", "c")]
    service._data.starts[p] = 1  # retention moved the log start
    await upkeep.follow_retention()
    assert trims and service.queue_info("w").first_offset == 1
    trims.clear()
    walks.clear()
    object.__setattr__(service.settings, "consumer_retention_ms", 5)
    await asyncio.sleep(0.02)  # the consumer's last ack is now past the retention
    await upkeep.follow_retention()
    assert any(b is not None for b in walks) and not trims
    assert service.queue_info("w").consumers == []
