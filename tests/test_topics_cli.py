"""`vqueues topics create`, and the topic check a node runs at start."""

import uuid
from concurrent.futures import ThreadPoolExecutor

from tests.support import FAST_GROUP, Topics, vqueues_cli
from vqueues.kafka.admin import Admin, TopicSpec


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


def test_a_node_refuses_to_start_without_its_topics(bootstrap):
    t = Topics(bootstrap, f"none{uuid.uuid4().hex[:6]}", 4)
    out = vqueues_cli("serve", "--http-port", "0", env={**FAST_GROUP, **t.env()})
    assert out.returncode == 3
    assert f"topic '{t.data}' does not exist" in out.stderr


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
