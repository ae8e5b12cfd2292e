"""`vqueues topics create` and `topics grow`, and the topic check a node runs at start."""

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Producer

from tests.support import (
    FAST_GROUP,
    NodeProcess,
    Topics,
    create_topics,
    events,
    http,
    kafka_records,
    vqueues_cli,
    wait_for,
)
from vqueues.kafka.admin import Admin, TopicSpec
from vqueues.layouts import Cut, Layout, decode_layout, encode_cut


def test_topics_create_makes_all_four_with_the_right_partition_counts(bootstrap):
    p = f"cli{uuid.uuid4().hex[:6]}"
    names = ("--data-topic", f"{p}-d", "--offset-topic", f"{p}-o", "--assignment-topic",
             f"{p}-a", "--snapshot-topic", f"{p}-s")
    out = vqueues_cli("topics", "create", "--bootstrap", bootstrap, "--partitions", "6", *names)
    assert out.returncode == 0, out.stderr
    assert f"{p}-d: created" in out.stdout and f"{p}-s: created" in out.stdout
    counts = Admin({"bootstrap.servers": bootstrap}).partition_counts(
        [f"{p}-d", f"{p}-o", f"{p}-a", f"{p}-s"])
    assert counts == {f"{p}-d": 6, f"{p}-o": 6, f"{p}-a": 1, f"{p}-s": 6}
    again = vqueues_cli("topics", "create", "--bootstrap", bootstrap, "--partitions", "6", *names)
    assert again.returncode == 0 and f"{p}-d: exists" in again.stdout


def test_a_node_refuses_to_start_on_mismatched_topics_naming_each(bootstrap):
    t = Topics(bootstrap, f"bad{uuid.uuid4().hex[:6]}", 4)
    Admin({"bootstrap.servers": bootstrap}).create([
        TopicSpec(t.data, 4), TopicSpec(t.offsets, 8), TopicSpec(t.assignments, 2)])
    out = vqueues_cli("serve", "--http-port", "0", env={**FAST_GROUP, **t.env()})
    assert out.returncode == 3
    for text in (f"'{t.data}' has 4 partitions", f"'{t.offsets}' has 8",
                 f"'{t.assignments}' has 2 partitions; it must have 1"):
        assert text in out.stderr


def test_a_node_refuses_to_start_without_its_topics_once_it_waited_for_them(bootstrap):
    t = Topics(bootstrap, f"none{uuid.uuid4().hex[:6]}", 4)
    started = time.monotonic()
    out = vqueues_cli("serve", "--http-port", "0",
                      env={**FAST_GROUP, **t.env(), "VQ_TOPIC_WAIT_MS": "1500"})
    assert out.returncode == 3
    assert f"topic '{t.data}' does not exist" in out.stderr
    assert "(not in the brokers' metadata after waiting 1.5 s)" in out.stderr
    assert time.monotonic() - started >= 1.5  # it looked again for the whole wait


def test_a_node_serves_topics_created_while_it_waits_for_them(bootstrap):
    """As after `vqueues topics create` on a cluster whose broker has not listed the topics
    yet, or topics another process creates a moment later: the node waits, then serves."""
    t = Topics(bootstrap, f"late{uuid.uuid4().hex[:6]}", 4)
    node = NodeProcess(t).start(wait_ready=False)
    try:
        def waiting() -> bool:
            assert node.process is not None and node.process.poll() is None, "node exited"
            return bool(events(node, "topics_waiting"))

        wait_for(waiting)
        [event] = events(node, "topics_waiting")
        assert sorted(event["missing"]) == sorted([t.data, t.offsets, t.assignments])
        create_topics(bootstrap, 4, prefix=t.prefix)
        node.wait_ready()
        status, body = http("POST", f"{node.url}/v1/queues/late/records",
                            {"records": [{"value": "v"}]})
        assert status == 200, body
    finally:
        node.terminate()


def test_a_node_waiting_for_its_topics_stops_at_once_on_sigterm(bootstrap):
    """A signal ends the wait for missing topics (`topic_wait_ms`): the node stops, exit 0,
    without waiting the rest of it out."""
    t = Topics(bootstrap, f"gone{uuid.uuid4().hex[:6]}", 4)
    node = NodeProcess(t, extra_env={"VQ_TOPIC_WAIT_MS": "60000"}).start(wait_ready=False)
    try:
        def waiting() -> bool:
            assert node.process is not None and node.process.poll() is None, "node exited"
            return bool(events(node, "topics_waiting"))

        wait_for(waiting)
        started = time.monotonic()
        assert node.terminate() == 0
        assert time.monotonic() - started < 10  # not the 60 s wait
    finally:
        node.terminate()


def _topic_set(prefix: str) -> tuple[str, ...]:
    return ("--data-topic", f"{prefix}-d", "--offset-topic", f"{prefix}-o",
            "--assignment-topic", f"{prefix}-a", "--snapshot-topic", f"{prefix}-s")


def test_topics_create_on_three_brokers_succeeds_every_time(kafka_bootstrap):
    """A broker answers the check's metadata request before it has learned the topics the
    controller just created (without the wait, 6 of these 16 runs exited 3): the check waits."""
    prefixes = [f"tc{uuid.uuid4().hex[:6]}" for _ in range(16)]

    def run(p: str):
        return vqueues_cli("topics", "create", "--bootstrap", kafka_bootstrap, "--partitions", "4",
                       *_topic_set(p))

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(run, prefixes))
    failed = [(o.returncode, o.stderr[-300:]) for o in outs if o.returncode != 0]
    assert not failed, f"{len(failed)} of {len(outs)} runs failed: {failed[:2]}"
    assert all(f"{p}-s: created" in o.stdout for p, o in zip(prefixes, outs, strict=True))


def test_topics_create_sets_the_compacted_segments_and_brings_existing_topics_in_line(
        kafka_bootstrap):
    admin = Admin({"bootstrap.servers": kafka_bootstrap})
    p = f"seg{uuid.uuid4().hex[:6]}"
    fresh = vqueues_cli("topics", "create", "--bootstrap", kafka_bootstrap, "--partitions", "2",
                    *_topic_set(p))
    assert fresh.returncode == 0, fresh.stderr
    want = {"segment.bytes": "104857600", "segment.ms": "3600000",
            "delete.retention.ms": "3600000"}
    keys = list(want)
    got = admin.topic_configs([f"{p}-o", f"{p}-a", f"{p}-s", f"{p}-d"], keys)
    assert got[f"{p}-o"] == got[f"{p}-a"] == got[f"{p}-s"] == want
    assert got[f"{p}-d"]["segment.bytes"] == "1073741824"  # the data topic keeps Kafka's

    # Topics made before these settings: compacted, with Kafka's segment defaults.
    old = f"old{uuid.uuid4().hex[:6]}"
    admin.create([TopicSpec(f"{old}-d", 2, config={"cleanup.policy": "delete"}),
                  *(TopicSpec(f"{old}-{r}", 1 if r == "a" else 2,
                              config={"cleanup.policy": "compact"}) for r in "oas")])
    out = vqueues_cli("topics", "create", "--bootstrap", kafka_bootstrap, "--partitions", "2",
                  "--compacted-segment-ms", "7200000", *_topic_set(old))
    assert out.returncode == 0, out.stderr
    for r in "oas":
        assert (f"{old}-{r}: exists; set segment.bytes=104857600 (was 1073741824), "
                "segment.ms=7200000 (was 604800000), delete.retention.ms=3600000 "
                "(was 86400000)") in out.stdout
    assert f"{old}-d: exists\n" in out.stdout
    assert admin.topic_configs([f"{old}-o"], keys)[f"{old}-o"] == {**want,
                                                                   "segment.ms": "7200000"}
    again = vqueues_cli("topics", "create", "--bootstrap", kafka_bootstrap, "--partitions", "2",
                    "--compacted-segment-ms", "7200000", *_topic_set(old))
    assert again.returncode == 0 and "set " not in again.stdout


def _grow(bootstrap: str, prefix: str, partitions: int, *flags: str):
    return vqueues_cli("topics", "grow", "--bootstrap", bootstrap, "--partitions",
                       str(partitions), *_topic_set(prefix), *flags)


def _layouts(bootstrap: str, prefix: str) -> list[Layout | None]:
    """The assignment topic's records, decoded as layouts, in order."""
    records = kafka_records(bootstrap, f"{prefix}-a")
    found = [decode_layout(key.encode(), value) for (_, _), (key, value, _, _)
             in sorted(records.items())]
    return [layout for layout in found if layout is not None]


def _created(bootstrap: str, partitions: int) -> str:
    p = f"gr{uuid.uuid4().hex[:6]}"
    out = vqueues_cli("topics", "create", "--bootstrap", bootstrap, "--partitions",
                      str(partitions), *_topic_set(p))
    assert out.returncode == 0, out.stderr
    return p


def test_topics_grow_makes_the_next_layout_and_writes_its_record_once(bootstrap):
    p = _created(bootstrap, 4)
    admin = Admin({"bootstrap.servers": bootstrap})
    new = [f"{p}-d.l1", f"{p}-o.l1", f"{p}-s.l1"]

    dry = _grow(bootstrap, p, 8, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.startswith("dry run: layout 1: 8 partitions, from 4 in layout 0: would "
                                 f"create {', '.join(new)} ")
    assert set(admin.partition_counts(new).values()) == {None}
    assert _layouts(bootstrap, p) == []

    out = _grow(bootstrap, p, 8)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (f"layout 1: 8 partitions, from 4 in layout 0: {new[0]} created, "
                          f"{new[1]} created, {new[2]} created; wrote layout/1 to {p}-a\n")
    assert admin.partition_counts(new) == dict.fromkeys(new, 8)
    assert _layouts(bootstrap, p) == [Layout(1, 8)]

    again = _grow(bootstrap, p, 8)
    assert again.returncode == 0, again.stderr
    assert again.stdout == (f"layout 1 has 8 partitions already ({', '.join(new)}): "
                            "nothing to do\n")
    assert _layouts(bootstrap, p) == [Layout(1, 8)]


def test_topics_grow_refuses_what_is_not_a_multiple_and_grows_a_grown_cluster_again(
        bootstrap):
    p = _created(bootstrap, 4)
    assert _grow(bootstrap, p, 8).returncode == 0
    refused = _grow(bootstrap, p, 12)
    assert refused.returncode == 2 and refused.stdout == ""
    assert ("vqueues topics grow: --partitions 12 is not a multiple of the current 8"
            in refused.stderr)
    waiting = _grow(bootstrap, p, 16)  # no node cut layout 0 yet
    assert waiting.returncode == 3
    assert "layout 1 is still being entered: 0 of the 4 partitions" in waiting.stderr
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for partition in range(4):  # what the nodes write once they cut layout 0
        key, value = encode_cut(Cut(1, partition, 0, 1, "n"), 1, 1)
        producer.produce(f"{p}-a", key=key, value=value, partition=0)
    assert producer.flush(30) == 0

    out = _grow(bootstrap, p, 16)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"layout 2: 16 partitions, from 8 in layout 1: {p}-d.l2 created")
    new = [f"{p}-d.l2", f"{p}-o.l2", f"{p}-s.l2"]
    assert Admin({"bootstrap.servers": bootstrap}).partition_counts(new) == dict.fromkeys(new, 16)
    assert _layouts(bootstrap, p) == [Layout(1, 8), Layout(2, 16)]


def test_topics_grow_refuses_without_the_current_layouts_topics(bootstrap):
    p = f"gr{uuid.uuid4().hex[:6]}"
    Admin({"bootstrap.servers": bootstrap}).create([TopicSpec(f"{p}-a", 1)])
    out = _grow(bootstrap, p, 8)
    assert out.returncode == 3
    assert f"topic '{p}-d' does not exist" in out.stderr


def test_topics_grow_gives_the_new_topics_the_configs_of_the_current_ones(kafka_bootstrap):
    p = f"grk{uuid.uuid4().hex[:6]}"
    made = vqueues_cli("topics", "create", "--bootstrap", kafka_bootstrap, "--partitions", "2",
                       "--retention-ms", "86400000", "--replication-factor", "2",
                       *_topic_set(p))
    assert made.returncode == 0, made.stderr
    out = _grow(kafka_bootstrap, p, 4)
    assert out.returncode == 0, out.stderr
    admin = Admin({"bootstrap.servers": kafka_bootstrap})
    keys = ["retention.ms", "cleanup.policy", "segment.bytes", "segment.ms",
            "delete.retention.ms"]
    roles = ("d", "o", "s")
    old = admin.topic_configs([f"{p}-{r}" for r in roles], keys)
    new = admin.topic_configs([f"{p}-{r}.l1" for r in roles], keys)
    assert old[f"{p}-d"]["retention.ms"] == "86400000"
    for r in roles:
        assert new[f"{p}-{r}.l1"] == old[f"{p}-{r}"]
    assert admin.replication_factors([f"{p}-d.l1", f"{p}-o.l1", f"{p}-s.l1"]) == \
        dict.fromkeys([f"{p}-d.l1", f"{p}-o.l1", f"{p}-s.l1"], 2)
    assert _layouts(kafka_bootstrap, p) == [Layout(1, 4)]
