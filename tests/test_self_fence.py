"""A paused owner refuses before it acts (docs/cluster.md, "A paused node").

The owner of a partition is stopped (SIGSTOP) until another node took the partition over and
served it; requests sent to the paused node meanwhile wait in its socket. When it resumes it
must not answer 200 for anything the new owner's replay ignores: no lease of a record the new
owner completed, no ack that the new owner does not show.
"""

import os
import signal
import threading
import time
from typing import Any

import pytest

from tests.narrow import known
from tests.support import create_topics, http, queues_in_partition, start_cluster

FENCED = {"VQ_SELF_FENCE_MS": "1000"}


def _serves(node, partition):
    status, body = http("GET", f"{node.url}/v1/partitions", timeout_s=5)
    return status == 200 and partition in body["ready"]


@pytest.mark.both_brokers
def test_a_paused_owner_answers_nothing_the_new_owner_ignores(bootstrap):
    t = create_topics(bootstrap, partitions=2)
    a, b = start_cluster(t, 2, env={0: FENCED, 1: FENCED})
    try:
        p = http("GET", f"{a.url}/v1/partitions")[1]["owned"][0]
        work, log = queues_in_partition(p, t.partitions, 2, prefix="fence")
        assert http("PUT", f"{a.url}/v1/queues/{work}/consumers/w",
                    {"mode": "lease", "visibility_ms": 60_000})[0] == 200
        assert http("POST", f"{a.url}/v1/queues/{work}/records",
                    {"records": [{"value": "job"}]})[0] == 200
        assert http("POST", f"{a.url}/v1/queues/{log}/records",
                    {"records": [{"value": str(i)} for i in range(3)]})[0] == 200

        os.kill(known(a.process).pid, signal.SIGSTOP)
        answers = {}
        try:
            def ask(name: str, method: str, url: str, body: Any) -> None:
                answers[name] = http(method, url, body, timeout_s=120)

            pending = [threading.Thread(target=ask, args=args) for args in (
                ("lease", "POST", f"{a.url}/v1/queues/{work}/consumers/w/lease",
                 {"max_records": 10}),
                ("ack", "POST", f"{a.url}/v1/queues/{log}/consumers/c/ack", {"offset": 3}))]
            for thread in pending:
                thread.start()
            deadline = time.monotonic() + 90
            while not _serves(b, p):
                assert time.monotonic() < deadline, "the other node never took the partition"
                time.sleep(0.2)
            status, leased = http("POST", f"{b.url}/v1/queues/{work}/consumers/w/lease",
                                  {"max_records": 10, "wait_ms": 5000})
            assert status == 200 and [r["value"] for r in leased["records"]] == ["job"]
            assert http("POST", f"{b.url}/v1/queues/{work}/consumers/w/complete",
                        {"tokens": [leased["records"][0]["token"]]})[0] == 200
        finally:
            os.kill(known(a.process).pid, signal.SIGCONT)
        for thread in pending:
            thread.join(60)

        status, body = answers["lease"]
        assert status != 200 or body["records"] == [], (
            f"the paused node handed out a record the new owner had completed: {body}")
        status, body = answers["ack"]
        if status == 200:  # then the new owner must know it
            info = http("GET", f"{b.url}/v1/queues/{log}")[1]
            assert [c["offset"] for c in info["consumers"] if c["consumer"] == "c"] == [3]
        else:
            assert body["error"]["retriable"], body
        refused = [answers[k][1]["error"]["code"] for k in answers if answers[k][0] != 200]
        print(f"\npaused owner's answers: {[(k, answers[k][0]) for k in sorted(answers)]}, "
              f"refusals {refused}")
        # The resumed node rejoins and serves again (its group or the map names an owner).
        deadline = time.monotonic() + 60
        while http("GET", f"{a.url}/readyz", timeout_s=5)[0] != 200:
            assert time.monotonic() < deadline, "the paused node did not serve again"
            time.sleep(0.2)
    finally:
        os.kill(known(a.process).pid, signal.SIGCONT)
        for n in (a, b):
            n.terminate()
