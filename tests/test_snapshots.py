"""Index snapshots on a real broker: a node writes them, its successor loads the latest and
replays only what came after; a corrupt one is ignored with a warning (full replay)."""

import itertools
import json
import uuid

import pytest
from confluent_kafka import Producer

from tests.support import (
    SNAPSHOT_FAST,
    NodeProcess,
    create_topics,
    events,
    http,
    observe,
    post,
    wait_for,
)
from vqueues.hashing import partition_for


@pytest.mark.both_brokers
def test_a_successor_loads_the_snapshot_and_replays_only_the_rest(bootstrap):
    t = create_topics(bootstrap, partitions=2)
    # Four queues in each partition: with eight random names, all of them fell in one partition
    # about once in 128 runs, and the other partition, empty, never wrote a snapshot.
    run = uuid.uuid4().hex[:4]
    names = (f"s{i}-{run}" for i in itertools.count())
    by_partition = [list(itertools.islice((q for q in names if partition_for(q, 2) == p), 4))
                    for p in (0, 1)]
    queues = [q for pair in zip(*by_partition, strict=True) for q in pair]  # 0, 1, 0, 1, ...
    first = NodeProcess(t, extra_env=SNAPSHOT_FAST).start()
    try:
        for i, q in enumerate(queues):
            offs = post(first, f"/v1/queues/{q}/records",
                        {"records": [{"value": f"{q}-{k}"} for k in range(5 + i)]})["offsets"]
            post(first, f"/v1/queues/{q}/consumers/c/ack", {"offset": offs[2]})
        assert http("DELETE", f"{first.url}/v1/queues/{queues[0]}")[0] == 200
        wait_for(lambda: len({e["partition"] for e in events(first, "snapshot_written")}) == 2)
        # After the snapshots: more records, acks and a deletion, only in the logs' tails.
        for q in queues[1:4]:
            offs = post(first, f"/v1/queues/{q}/records", {"records": [{"value": "late"}]})
            post(first, f"/v1/queues/{q}/consumers/late/ack", {"offset": offs["offsets"][0]})
        assert http("DELETE", f"{first.url}/v1/queues/{queues[4]}/consumers/c")[0] == 200
        before = observe(first, queues)
    finally:
        assert first.kill() == -9
    second = NodeProcess(t).start()
    try:
        loaded = events(second, "snapshot_loaded")
        assert {e["partition"] for e in loaded} == {0, 1}
        assert sum(e["records"] for e in loaded) > 0
        assert observe(second, queues) == before
    finally:
        second.terminate()


def test_a_corrupt_snapshot_is_ignored_with_a_warning_and_the_partition_replayed(bootstrap):
    t = create_topics(bootstrap, partitions=1)
    node = NodeProcess(t).start()
    try:
        post(node, "/v1/queues/whole/records", {"records": [{"value": "a"}, {"value": "b"}]})
        before = observe(node, ["whole"])
    finally:
        node.terminate()
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(t.snapshots, key=b'["m",0]', partition=0, value=json.dumps({
        "v": 2, "id": 9, "chunks": 2, "sha256": "0" * 64, "data_position": 2,
        "offsets_position": 0, "log_start": 0, "queues": 1, "records": 2, "ts": 1}).encode())
    assert p.flush(10) == 0
    node = NodeProcess(t).start()
    try:
        assert [e["partition"] for e in events(node, "snapshot_ignored")] == [0]
        assert events(node, "snapshot_loaded") == []
        assert observe(node, ["whole"]) == before
    finally:
        node.terminate()


def test_a_node_stopped_with_sigterm_snapshots_what_changed_for_whoever_comes_next(bootstrap):
    """With no periodic snapshot due (the interval is 300 s), SIGTERM snapshots each partition
    that took in at least 1,000 records since its last snapshot, before the node leaves: the
    node restarted in place loads them instead of replaying the topic."""
    t = create_topics(bootstrap, partitions=2)
    run = uuid.uuid4().hex[:4]
    names = (f"stop{i}-{run}" for i in itertools.count())
    busy = [next(q for q in names if partition_for(q, 2) == p) for p in (0, 1)]
    quiet = next(q for q in names if partition_for(q, 2) == 0)
    node = NodeProcess(t)
    node.start()
    try:
        for q in busy:
            for k in range(11):
                post(node, f"/v1/queues/{q}/records",
                     {"records": [{"value": f"{q}-{k}-{i}"} for i in range(100)]})
            post(node, f"/v1/queues/{q}/consumers/c/ack", {"offset": 500})
        post(node, f"/v1/queues/{quiet}/records", {"records": [{"value": "quiet"}]})
        before = observe(node, [*busy, quiet])
    finally:
        assert node.terminate() == 0
    written = events(node, "snapshot_written")
    assert sorted(e["partition"] for e in written) == [0, 1]
    assert [e["written"] for e in events(node, "snapshots_at_stop")] == [2]
    node.start()  # the same node id, restarted in place
    try:
        loaded = events(node, "snapshot_loaded")
        assert {e["partition"] for e in loaded} == {0, 1}
        assert observe(node, [*busy, quiet]) == before
    finally:
        node.terminate()
