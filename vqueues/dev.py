"""`vqueues dev`: a broker plus N nodes on loopback, supervised until Ctrl-C. The broker is the
embedded one, or with `--kafka` a local three-broker Apache Kafka cluster."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from vqueues.hashing import partition_for
from vqueues.kafka import client_config, topics
from vqueues.kafka.admin import Admin
from vqueues.kafka.broker import EmbeddedBroker
from vqueues.kafka.local_cluster import KAFKA_VERSION, LocalKafkaCluster

log = logging.getLogger("vqueues.dev")

# Settings `vqueues dev` gives its nodes: a first group join in seconds on the embedded broker.
DEV_ENV = {"VQ_SESSION_TIMEOUT_MS": "6000", "VQ_HEARTBEAT_INTERVAL_MS": "500"}


def _get_json(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, {}
    except (OSError, ValueError):
        return 0, {}


def _wait_ready(urls: list[str], nodes: list[subprocess.Popen[bytes]],
                stopping: Callable[[], bool], timeout_s: float = 120.0) -> bool:
    """Wait until every node answers /readyz and the partitions are all owned."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stopping():
        if any(n.poll() is not None for n in nodes):
            return False
        owned: list[int] = []
        ready = True
        for url in urls:
            status, body = _get_json(f"{url}/readyz")
            ready &= status == 200
            owned += body.get("ready", [])
        if ready and len(owned) == len(set(owned)) == _get_json(
                f"{urls[0]}/v1/partitions")[1].get("partitions"):
            return True
        time.sleep(0.2)
    return False


def _banner(urls: list[str], bootstrap: str, partitions: int,
            broker_name: str = "the embedded broker") -> str:
    demo = partition_for("demo", partitions)
    owner = next((u for u in urls if demo in _get_json(f"{u}/v1/partitions")[1].get("owned", [])),
                 urls[0])
    json_h = "-H 'Content-Type: application/json'"
    lines = [f"vqueues is running on {broker_name} at {bootstrap}",
             *(f"  node {i}: {u}" for i, u in enumerate(urls)),
             "",
             "Try it (queue 'demo' lives on " + owner + "):",
             f"  curl -s -X POST {owner}/v1/queues/demo/records {json_h} "
             "-d '{\"records\": [{\"value\": \"hello\"}]}'",
             f"  curl -s '{owner}/v1/queues/demo/records?consumer=me'",
             f"  curl -s -X POST {owner}/v1/queues/demo/consumers/me/ack {json_h} "
             "-d '{\"offset\": 1}'",
             f"  curl -s {owner}/v1/queues/demo",
             f"  curl -s {urls[0]}/v1/partitions",
             "",
             "Press Ctrl-C to stop."]
    return "\n".join(lines)


def run_dev(nodes: int, partitions: int, http_port: int, broker_port: int | None,
            log_format: str, kafka: bool = False) -> int:
    """Start the broker and the nodes, print the banner, supervise until a signal; then stop
    every process it started. With `kafka`, the broker is a local Apache Kafka cluster."""
    stopping = False

    def on_signal(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    broker: EmbeddedBroker | LocalKafkaCluster
    if kafka:
        broker = LocalKafkaCluster().start()
        broker_name = f"Apache Kafka {KAFKA_VERSION} ({broker.size} brokers)"
    else:
        broker = EmbeddedBroker(broker_port).start()
        broker_name = "the embedded broker"
    nodes_wanted = nodes
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # On Kafka, the cluster's default replication (3, min.insync.replicas 2).
        topics.create(Admin(client_config(broker.bootstrap)), topics.specs(
            "vq-data", "vq-offsets", "vq-assignments", partitions,
            replication_factor=-1 if kafka else 1, snapshot_topic="vq-snapshots"))
        for i in range(nodes_wanted):
            env = {**DEV_ENV, **os.environ, "VQ_BOOTSTRAP": broker.bootstrap,
                   "VQ_HTTP_PORT": str(http_port + i), "VQ_NODE_ID": f"node-{i}",
                   "VQ_LOG_FORMAT": log_format}
            procs.append(subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=env))
        urls = [f"http://127.0.0.1:{http_port + i}" for i in range(nodes_wanted)]
        if _wait_ready(urls, procs, lambda: stopping):
            log.info("dev_cluster_ready", extra={"bootstrap": broker.bootstrap, "nodes": urls})
            print(_banner(urls, broker.bootstrap, partitions, broker_name), flush=True)
        while not stopping:
            for n in procs:
                if n.poll() is not None:
                    log.error("node_exited", extra={"pid": n.pid, "status": n.returncode})
                    stopping = True
            time.sleep(0.2)
    finally:
        for n in procs:
            if n.poll() is None:
                n.send_signal(signal.SIGTERM)
        for n in procs:
            try:
                n.wait(20)
            except subprocess.TimeoutExpired:
                n.kill()
                n.wait()
        broker.stop()
    return 0
