"""Layouts (ADR 19) against the embedded broker (tests/test_growth.py runs growths on both): a
node started on a cluster whose newest layout is 1 cuts layout 0 first, then serves layout 1,
with every data offset tagged with the layout, through a SIGKILL."""

import asyncio
import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from vqueues_client import AsyncClient, NewRecord

from tests.narrow import known
from tests.support import NodeProcess, Topics, create_topics, events, kafka_records
from vqueues.hashing import partition_for
from vqueues.kafka import topics as kafka_topics
from vqueues.kafka.admin import Admin
from vqueues.layouts import Layout, encode_layout, kafka_offset, layout_of, tag, topic_name


def grow(t: Topics, layout: Layout) -> None:
    """What `vqueues topics grow` leaves behind: the layout's topics, then its record."""
    specs = kafka_topics.specs(topic_name(t.data, layout.number),
                               topic_name(t.offsets, layout.number), t.assignments,
                               layout.partitions,
                               snapshot_topic=topic_name(t.snapshots, layout.number))
    Admin({"bootstrap.servers": t.bootstrap}).create(
        [s for s in specs if s.name != t.assignments])
    producer = Producer({"bootstrap.servers": t.bootstrap, "acks": "all"})
    key, value = encode_layout(layout, int(time.time() * 1000))
    producer.produce(t.assignments, key=key, value=value, partition=0)
    assert producer.flush(30) == 0


def keys_and_headers(bootstrap: str, topic: str) -> list[tuple[bytes | None, str]]:
    """Every record of `topic` as (key, its header names joined)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "enable.partition.eof": True, "enable.auto.commit": False})
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[tuple[bytes | None, str]] = []
    ends = 0
    while ends < len(parts):
        m = consumer.poll(1.0)
        if m is None:
            continue
        if m.error():
            ends += 1
            continue
        raw = m.headers() or ()
        names = [h[0] for h in raw] if isinstance(raw, (list, tuple)) else list(raw)
        key = m.key()
        out.append((key if isinstance(key, bytes) else None, ",".join(names)))
    consumer.close()
    return out


async def served(vq: AsyncClient, layout: int, partitions: int) -> dict[str, Any]:
    """The node's map once it serves `layout`, every partition ready (it may restart first)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            cmap = await vq.cluster_map()
        except Exception:  # the node restarting on the new layout
            cmap = {}
        if cmap.get("layout") == layout and len(cmap.get("ready", [])) == partitions:
            assert cmap["partitions"] == partitions
            return cmap
        assert time.monotonic() < deadline, cmap
        await asyncio.sleep(0.2)


async def test_a_node_on_layout_one_tags_every_offset_and_keeps_state_through_a_kill(
        bootstrap: str) -> None:
    t = create_topics(bootstrap, partitions=4)
    grow(t, Layout(1, 8))
    node = NodeProcess(t, extra_env={"VQ_SCHEDULER_TICK_MS": "100"}).start(wait_ready=False)
    try:
        async with AsyncClient(node.url) as vq:
            cmap = await served(vq, 1, 8)  # after cutting layout 0, empty as it is
            assert sorted(cmap["owners"]) == [str(p) for p in range(8)]
            queues = [f"lay-{uuid.uuid4().hex[:6]}-{i}" for i in range(12)]
            written: dict[str, list[int]] = {}
            for q in queues:
                answer = await vq.enqueue(q, [NewRecord(f"{q}:{i}") for i in range(3)])
                assert answer.partition == partition_for(q, 8)
                written[q] = list(known(answer.offsets))
            on_kafka = kafka_records(bootstrap, topic_name(t.data, 1))
            for q, offsets in written.items():
                assert all(layout_of(o) == 1 for o in offsets)
                for i, o in enumerate(offsets):
                    key, value, _ts, _h = on_kafka[(partition_for(q, 8), kafka_offset(o))]
                    assert (key, value) == (q, f"{q}:{i}".encode())
            # Layout 0 got nothing but its cut markers.
            assert sorted(keys_and_headers(bootstrap, t.data)) == \
                [(None, "vq-layout-cut")] * 4

            first = queues[0]
            page = await vq.read(first, consumer="c")
            assert [r.offset for r in page.records] == written[first]
            await vq.ack(first, "c", written[first][1])
            await vq.configure_consumer(queues[1], "w", mode="lease")
            leased = await vq.lease(queues[1], "w", max_records=3, visibility_ms=60_000)
            assert [lease.record.offset for lease in leased] == written[queues[1]]
            await vq.complete(queues[1], "w", leased[:2])
            delayed = await vq.enqueue(queues[2], "later", delay_ms=1500)
            assert layout_of(known(delayed.offsets)[0]) == 1
        node.kill()
        node.start()
        async with AsyncClient(node.url) as vq:
            page = await vq.read(first, consumer="c")
            assert [r.offset for r in page.records] == written[first][1:]
            await asyncio.sleep(2.0)
            again = await vq.lease(queues[1], "w", max_records=3, visibility_ms=60_000)
            assert [lease.record.offset for lease in again] in ([], written[queues[1]][2:])
            page = await vq.read(queues[2], offset=0)
            texts = [r.value for r in page.records]
            assert texts == [f"{queues[2]}:{i}".encode() for i in range(3)] + [b"later"]
            assert layout_of(page.records[-1].offset) == 1
            assert page.records[-1].offset > tag(1, 0)
    finally:
        node.terminate()


async def test_a_node_started_after_a_growth_was_announced_cuts_the_old_layout_first(
        bootstrap: str) -> None:
    """The layout before holds records and nobody cut it yet: the node serves it, cuts it,
    and restarts on the new one, whose partitions take the old records over."""
    t = create_topics(bootstrap, partitions=4)
    producer = Producer({"bootstrap.servers": t.bootstrap, "acks": "all"})
    producer.produce(t.data, key=b"kept", value=b"v", partition=partition_for("kept", 4))
    assert producer.flush(30) == 0
    grow(t, Layout(1, 8))
    node = NodeProcess(t).start(wait_ready=False)
    try:
        async with AsyncClient(node.url) as vq:
            await served(vq, 1, 8)
            page = await vq.read("kept", offset=0)
            assert [(r.offset, r.value) for r in page.records] == [(0, b"v")]
    finally:
        node.terminate()
    [leaving] = events(node, "layout_leaving")
    assert (leaving["layout"], leaving["for"]) == (0, 1)
