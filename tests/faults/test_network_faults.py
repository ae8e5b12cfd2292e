"""The fault tier: a node whose every Kafka connection goes through a proxy that fails on demand
(tests/faults/proxy.py), under cursor enqueue/ack load and lease/complete load.

Faults, one after another: every connection dropped (three times), traffic black-holed for 6 s
(connections stay open), 100 ms of latency on every chunk for 4 s. Afterwards the node is
SIGKILLed and a successor, which knows only what Kafka kept, checks: no acknowledged record, ack
or completion was lost, and no completed record is leased again. The recovery after each fault
(the longest time between two successful calls of a kind) is printed; `-s` shows it.
"""

import itertools
import threading
import time
from collections import defaultdict

import pytest

from tests.faults.proxy import FaultProxy
from tests.support import NodeProcess, create_topics, http
from vqueues.broker import EmbeddedBroker, free_port

pytestmark = pytest.mark.faults

CALL_TIMEOUT_S = 15


@pytest.fixture
def proxied():
    """tansu advertising a proxy's port: every client of a node talks to it through the proxy."""
    proxy_port, broker_port = free_port(), free_port()
    proxy = FaultProxy("127.0.0.1", proxy_port, broker_port).start()
    broker = EmbeddedBroker(port=broker_port, advertised_port=proxy_port).start()
    try:
        yield proxy, f"127.0.0.1:{proxy_port}"
    finally:
        broker.stop()
        proxy.stop()


class Load:
    """Three loops against one node: a writer, a cursor reader that acks, and a worker that
    enqueues to a work queue, leases and completes. Every 200 answer is remembered."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.stop = threading.Event()
        self.written: list[str] = []  # values of acknowledged enqueues (cursor queue)
        self.acked = 0  # highest acknowledged ack offset
        self.jobs: list[str] = []  # values of acknowledged enqueues (work queue)
        self.completed: set[str] = set()  # values whose completion was acknowledged
        self.successes: dict[str, list[float]] = defaultdict(list)
        self.statuses: dict[int, int] = defaultdict(int)

    def _call(self, kind: str, method: str, path: str, body: object = None):
        status, answer = http(method, self.url + path, body, timeout_s=CALL_TIMEOUT_S)
        self.statuses[status] += 1
        if status == 200:
            self.successes[kind].append(time.monotonic())
        return status, answer

    def writer(self) -> None:
        n = 0
        while not self.stop.is_set():
            values = [f"a-{n + i}" for i in range(10)]
            if self._call("enqueue", "POST", "/v1/queues/fault-a/records",
                          {"records": [{"value": v} for v in values]})[0] == 200:
                self.written += values
                n += 10
            time.sleep(0.02)

    def reader(self) -> None:
        while not self.stop.is_set():
            status, page = self._call("read", "GET", "/v1/queues/fault-a/records"
                                      "?consumer=c&limit=100&wait_ms=200")
            if status == 200 and page["records"]:
                offset = page["next_offset"]
                if self._call("ack", "POST", "/v1/queues/fault-a/consumers/c/ack",
                              {"offset": offset})[0] == 200:
                    self.acked = max(self.acked, offset)
            elif status != 200:
                time.sleep(0.05)

    def worker(self) -> None:
        n = 0
        while not self.stop.is_set():
            values = [f"w-{n + i}" for i in range(10)]
            if self._call("enqueue_work", "POST", "/v1/queues/fault-w/records",
                          {"records": [{"value": v} for v in values]})[0] == 200:
                self.jobs += values
                n += 10
            status, page = self._call("lease", "POST", "/v1/queues/fault-w/consumers/w/lease",
                                      {"max_records": 10, "wait_ms": 100})
            if status == 200 and page["records"]:
                tokens = [r["token"] for r in page["records"]]
                if self._call("complete", "POST", "/v1/queues/fault-w/consumers/w/complete",
                              {"tokens": tokens})[0] == 200:
                    self.completed.update(r["value"] for r in page["records"])

    def run(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=f, daemon=True)
                   for f in (self.writer, self.reader, self.worker)]
        for t in threads:
            t.start()
        return threads

    def longest_gap(self, since: float) -> tuple[float, str]:
        """The longest time, from `since` until now, between two successes of one kind (a kind
        with none since then: all of it), and that kind."""
        now = time.monotonic()
        worst = (0.0, "")
        for kind, times in self.successes.items():
            points = [since, *(t for t in times if t >= since), now]
            worst = max(worst, (max(b - a for a, b in itertools.pairwise(points)), kind))
        return worst


def test_dropped_black_holed_and_slow_broker_connections_lose_nothing(proxied):
    proxy, bootstrap = proxied
    t = create_topics(bootstrap, partitions=4)
    node = NodeProcess(t, node_id="faulty").start()
    successor = None
    try:
        assert http("PUT", f"{node.url}/v1/queues/fault-w/consumers/w",
                    {"mode": "lease", "visibility_ms": 2000})[0] == 200
        load = Load(node.url)
        threads = load.run()
        time.sleep(3)
        figures = {}
        start = time.monotonic()
        for _ in range(3):
            proxy.drop()
            time.sleep(1.5)
        time.sleep(2)
        figures["3 drops of every connection"] = load.longest_gap(start)
        start = time.monotonic()
        proxy.black_hole(True)
        time.sleep(6)
        proxy.black_hole(False)
        healed = time.monotonic()
        time.sleep(8)
        figures["6 s black hole"] = load.longest_gap(start)
        figures["after the black hole: longest gap"] = load.longest_gap(healed)
        start = time.monotonic()
        proxy.latency(0.1)
        time.sleep(4)
        proxy.latency(0)
        time.sleep(2)
        figures["4 s of 100 ms latency"] = load.longest_gap(start)
        load.stop.set()
        for th in threads:
            th.join(CALL_TIMEOUT_S + 5)
        print("\nfault tier (could not serve: longest time between two successful calls of "
              "a kind):")
        for name, (seconds, kind) in figures.items():
            print(f"  {name:40} {seconds:5.1f} s  ({kind})")
        print(f"  statuses {dict(load.statuses)}; {len(load.written)} records, "
              f"{len(load.completed)} completions acknowledged")
        assert not any(500 <= s < 503 or s == 400 or s >= 504 for s in load.statuses), \
            dict(load.statuses)
        assert load.written and load.completed and load.acked

        node.kill()
        successor = NodeProcess(t, node_id="successor").start()
        url = successor.url
        records, offset = [], 0
        while True:
            status, page = http("GET", f"{url}/v1/queues/fault-a/records?offset={offset}"
                                "&limit=1000")
            assert status == 200
            records += [r["value"] for r in page["records"]]
            if not page["records"]:
                break
            offset = page["next_offset"]
        assert set(load.written) <= set(records), "an acknowledged record was lost"
        committed = [c["offset"] for c in http("GET", f"{url}/v1/queues/fault-a")[1]["consumers"]
                     if c["consumer"] == "c"]
        assert committed and committed[0] >= load.acked, "an acknowledged ack was lost"
        # Every job not completed comes again (visibility 2 s); no completed one does.
        pending = set(load.jobs) - load.completed
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        while not pending <= seen and time.monotonic() < deadline:
            status, page = http("POST", f"{url}/v1/queues/fault-w/consumers/w/lease",
                                {"max_records": 1000, "wait_ms": 500})
            assert status == 200
            values = {r["value"] for r in page["records"]}
            assert not values & load.completed, "a completed record was leased again"
            seen |= values
        assert pending <= seen, f"{len(pending - seen)} jobs never came again"
    finally:
        node.kill()
        if successor is not None:
            successor.terminate()
