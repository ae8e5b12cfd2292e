"""The admin CLI against a real node: `vqueues queues|consumers|cluster`, run as a user would
(a subprocess), with --json for checks and the tables people read."""

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest
from vqueues_client import Client

from tests.narrow import known


def vq(node, *args, stdin=None):
    """Run `vqueues ARGS --url NODE`; returns the CompletedProcess."""
    return subprocess.run([sys.executable, "-m", "vqueues", *args, "--url", node.url],
                          capture_output=True, text=True, timeout=120, input=stdin,
                          env={**os.environ})


def vq_json(node, *args):
    done = vq(node, *args, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def queue():
    return f"adm/{uuid.uuid4().hex[:8]}"


def test_queues_list_and_stats_show_depth_and_the_worst_lag(node, queue):
    with Client(node.url) as c:
        c.enqueue(queue + "/a", ["1", "2", "3"])
        c.enqueue(queue + "/b", ["1"])
        c.ack(queue + "/a", "slow", 0)
        c.ack(queue + "/a", "fast", 3)
    rows = vq_json(node, "queues", "list", "--prefix", queue + "/")
    assert [(r["queue"], r["records"], r["consumers"], r["max_lag"]) for r in rows] == [
        (queue + "/a", 3, 2, 3), (queue + "/b", 1, 0, 0)]
    table = vq(node, "queues", "list", "--prefix", queue + "/")
    assert table.returncode == 0
    assert "MAX LAG" in table.stdout and f"{queue}/a" in table.stdout
    stats = vq_json(node, "queues", "stats", queue + "/a")
    consumers = {c["consumer"]: c["lag"] for c in stats["queues"][0]["consumers"]}
    assert consumers == {"fast": 0, "slow": 3}
    missing = vq(node, "queues", "stats", queue + "/none")
    assert missing.returncode == 1 and "not found" in missing.stderr
    listing = vq_json(node, "consumers", "list", queue + "/a")
    assert sorted(c["consumer"] for c in listing) == ["fast", "slow"]


def test_consumers_reset_rewinds_and_skips_by_offset_time_and_shift(node, queue):
    with Client(node.url) as c:
        o = known(c.enqueue(queue, ["a", "b", "c"]).offsets)
        time.sleep(0.05)
        middle = int(time.time() * 1000)
        time.sleep(0.05)
        o += known(c.enqueue(queue, ["d", "e"]).offsets)
        c.ack(queue, "r", o[1])

        def committed():
            return next(x["offset"] for x in known(c.queue_info(queue))["consumers"]
                        if x["consumer"] == "r")

        def reset(*how):
            done = vq(node, "consumers", "reset", queue, "r", *how, "--yes")
            assert done.returncode == 0, done.stdout + done.stderr
            return committed()

        refused = vq(node, "consumers", "reset", queue, "r", "--to-latest", stdin="")
        assert refused.returncode == 1 and "refusing to reset without --yes" in refused.stderr
        dry = vq_json(node, "consumers", "reset", queue, "r", "--to-latest", "--dry-run")
        assert (dry["from"], dry["to"], committed()) == (o[1], o[4] + 1, o[1])
        assert reset("--to-latest") == o[4] + 1
        assert reset("--to-time", str(middle)) == o[3]  # "d": first stamped at/after `middle`
        assert reset("--to-time", "2020-01-01T00:00:00Z") == o[0]
        assert reset("--shift-by", "2") == o[2]
        assert reset("--shift-by", "-1") == o[1]
        assert reset("--to-offset", str(o[4])) == o[4]
        assert reset("--to-earliest") == o[0]
        gone = vq(node, "consumers", "delete", queue, "r", "--yes")
        assert gone.returncode == 0 and "deleted" in gone.stdout
        assert known(c.queue_info(queue))["consumers"] == []


def test_queues_tail_prints_records_and_shows_progress(node, queue):
    with Client(node.url) as c:
        offsets = known(c.enqueue(queue, ["one", "two", "three"]).offsets)
    done = vq(node, "queues", "tail", queue, "--from-start", "--count", "3", "--json",
              "--progress")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(r["offset"], r["value"]) for r in lines] == list(zip(offsets, ["one", "two", "three"],
                                                                  strict=True))
    assert "3/3" in done.stderr  # the progress bar, finished
    plain = vq(node, "queues", "tail", queue, "--offset", str(offsets[1]), "--no-follow")
    assert plain.returncode == 0
    assert [line.split("\t")[::2] for line in plain.stdout.splitlines()] == [
        [str(offsets[1]), "two"], [str(offsets[2]), "three"]]


def test_queues_delete_by_prefix_asks_then_deletes_with_a_progress_bar(node, queue):
    with Client(node.url) as c:
        for i in range(5):
            c.enqueue(f"{queue}/{i}", ["x"])
    refused = vq(node, "queues", "delete", "--prefix", queue + "/", stdin="")
    assert refused.returncode == 1 and "refusing to delete without --yes" in refused.stderr
    done = vq(node, "queues", "delete", "--prefix", queue + "/", "--yes", "--progress")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": deleted (1 record(s)") == 5 and "5/5" in done.stderr
    assert vq_json(node, "queues", "list", "--prefix", queue + "/") == []


def test_cluster_shows_nodes_partitions_owners_readiness_and_replay(node, topics):
    info = vq_json(node, "cluster")
    assert info["map"]["partitions"] == topics.partitions
    [me] = info["nodes"]
    assert me["status"] == "ready" and len(me["details"]) == topics.partitions
    assert all(d["ready"] and d["next_offset"] >= d["log_start"] for d in me["details"])
    table = vq(node, "cluster")
    assert table.returncode == 0
    assert "PARTITION" in table.stdout and "REPLAY" in table.stdout
    assert table.stdout.count("done") == topics.partitions


def test_consumers_prefixes_shows_each_prefix_consumer_with_backlog_and_in_flight(node, queue):
    with Client(node.url) as c:
        # One record per queue per turn: two leased records come from both queues (with the
        # default turn of 10 both could come from the queue whose turn came first).
        c.configure_prefix_consumer("crew", queue + "/", max_attempts=7, records_per_turn=1)
        c.enqueue(queue + "/a", ["1", "2", "3"])
        c.enqueue(queue + "/b", ["1"])

    async def lease_two() -> None:
        from vqueues_client import AsyncClient
        async with AsyncClient(node.url) as avq:
            got: list[Any] = []
            for _ in range(50):
                got += await avq.lease_prefix("crew", node.url, max_records=2 - len(got))
                # (one node: it wrote the definition, so it knows it at once)
                if len(got) == 2:
                    return
                await asyncio.sleep(0.1)
    asyncio.run(lease_two())
    rows = vq_json(node, "consumers", "prefixes")
    crew = next(r for r in rows if r["consumer"] == "crew")
    assert (crew["prefix"], crew["queues"], crew["in_flight"], crew["backlog"],
            crew["max_attempts"]) == (queue + "/", 2, 2, 4, 7)
    table = vq(node, "consumers", "prefixes")
    assert table.returncode == 0 and "BACKLOG" in table.stdout and "crew" in table.stdout
