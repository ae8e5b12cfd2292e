"""Idempotent enqueue against the model of the documented rule, on real node processes and the
real broker: random keyed requests (tests/keyed_model.py makes them) sent to
two nodes that write snapshots every second, with SIGTERM restarts and takeovers between the
nodes at random points. Each request is sent until it gets an answer that settles it (a
transport error, 503 or wrong_node leave it open: it is sent again, unchanged, as a client
would), and that answer must be the model's. At the end the data topic holds exactly one
record per key (moved copies of scheduled records aside) and nothing else.

`scripts/idempotency_model.py` runs it longer, over more seeds."""

import os
import random
import time
from typing import Any, cast

import pytest

from tests.keyed_model import KeyModel, Requests
from tests.support import (
    NodeProcess,
    create_topics,
    http,
    kafka_records,
    start_cluster,
    wait_settled,
)
from vqueues.hashing import partition_for
from vqueues.state.idempotency import KEY_HEADER
from vqueues.state.schedule import FROM_HEADER

PARTITIONS = 4
SNAPSHOTS = {"VQ_SNAPSHOT_INTERVAL_S": "1", "VQ_SNAPSHOT_MIN_RECORDS": "1"}
SEEDS = [int(s) for s in os.environ.get("VQ_IDEMPOTENCY_MODEL_SEEDS", "7").split(",")]
STEPS = int(os.environ.get("VQ_IDEMPOTENCY_MODEL_STEPS", "60"))


def now_ms() -> int:
    return int(time.time() * 1000)


class Cluster:
    def __init__(self, nodes: list[NodeProcess]) -> None:
        self.nodes = nodes
        self.owners: dict[int, str] = {}

    def live(self) -> list[NodeProcess]:
        return [n for n in self.nodes if n.process is not None]

    def settle(self, timeout_s: float = 120.0) -> None:
        """Every partition owned once, and every live node joined with its partitions ready
        (`wait_settled` alone lets a node that has not joined yet pass: a fault then, in the
        middle of its join, left the embedded broker's group without an assignment)."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.owners = wait_settled(self.nodes, PARTITIONS)
            if all(http("GET", f"{n.url}/readyz", timeout_s=5)[0] == 200 for n in self.live()):
                return
            assert time.monotonic() < deadline, "a node did not join"
            time.sleep(0.2)

    def send(self, queue: str, records: list[dict[str, Any]], timeout_s: float = 90.0
             ) -> dict[str, Any]:
        """The answer that settles the request: 200, or a 4xx that is not retriable."""
        deadline = time.monotonic() + timeout_s
        body = {"records": records}
        while time.monotonic() < deadline:
            url = self.owners.get(partition_for(queue, PARTITIONS)) or self.live()[0].url
            status, answer = http("POST", f"{url}/v1/queues/{queue}/records", body,
                                  timeout_s=10)
            if status == 200 or (isinstance(answer, dict) and "error" in answer
                                 and not answer["error"]["retriable"]
                                 and answer["error"]["code"] != "wrong_node"):
                return cast(dict[str, Any], answer)
            if isinstance(answer, dict) and answer.get("error", {}).get("owner"):
                self.owners[partition_for(queue, PARTITIONS)] = answer["error"]["owner"]
            else:
                self.owners.pop(partition_for(queue, PARTITIONS), None)
            time.sleep(0.1)
        raise TimeoutError(f"no answer for {queue}: {records}")


def run_on_nodes(bootstrap: str, seed: int, steps: int) -> dict[str, int]:
    rng = random.Random(seed)
    t = create_topics(bootstrap, partitions=PARTITIONS)
    nodes = start_cluster(t, 2, env={0: SNAPSHOTS, 1: SNAPSHOTS})
    cluster = Cluster(nodes)
    model, requests = KeyModel(PARTITIONS), Requests(rng, now_ms)
    counts = {"requests": 0, "refused": 0, "pauses": 0, "restarts": 0, "takeovers": 0}
    try:
        cluster.settle()
        for _ in range(steps):
            roll = rng.random()
            if roll < 0.06:  # a snapshot or two gets written meanwhile; scheduled ones fall due
                time.sleep(1.2)
                counts["pauses"] += 1
            elif roll < 0.10:  # SIGTERM and start again in place
                node = rng.choice(nodes)
                node.terminate()
                node.start(wait_ready=False)
                cluster.settle()
                counts["restarts"] += 1
            elif roll < 0.13:  # the other node takes every partition over, then shares again
                node = rng.choice(nodes)
                node.terminate()
                cluster.settle()
                node.start(wait_ready=False)
                cluster.settle()
                counts["takeovers"] += 1
            else:
                queue, records = requests.next()
                answer = cluster.send(queue, records)
                model.check(queue, records, answer)
                counts["requests"] += 1
                counts["refused"] += "error" in answer
    finally:
        for n in nodes:
            n.terminate()
    written: dict[tuple[str, str], list[int]] = {}
    for (_, offset), (queue, _, _, headers) in kafka_records(bootstrap, t.data).items():
        h = dict(headers)
        if FROM_HEADER in h:
            continue  # a scheduled record's moved copy: the record is the scheduled one
        assert KEY_HEADER in h, "a record without a key was written"
        written.setdefault((queue, h[KEY_HEADER].decode()), []).append(offset)
    assert {qk: [o] for qk, (_, o) in model.first.items()} == written
    counts["keys"] = len(written)
    return counts


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_keyed_enqueues_across_restarts_takeovers_and_snapshots_follow_the_model(
        bootstrap, seed):
    counts = run_on_nodes(bootstrap, seed, STEPS)
    print(f"idempotency model, seed {seed}: {counts}")
    assert counts["requests"] and counts["refused"]
    assert counts["restarts"] + counts["takeovers"] > 0
