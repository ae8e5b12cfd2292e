"""A node SIGKILLed under SDK load (docs/sqs.md, "Routing in a cluster"): boto3 clients with
their default retries keep sending, receiving and deleting through the surviving node's
endpoint while the killed node's queues move; every call succeeds, every acknowledged message
is received, and no message is received again after its deletion was answered."""

import random
import threading
import time
import uuid

import boto3
import pytest
from botocore.config import Config

from tests.support import create_topics, queues_in_partition, start_cluster, wait_settled

PARTITIONS = 8
VISIBILITY_S = 4


@pytest.fixture
def nodes(default_bootstrap):
    t = create_topics(default_bootstrap, partitions=PARTITIONS)
    started = start_cluster(t, 2)
    try:
        yield started
    finally:
        for n in started:
            n.terminate()


def sdk(url):
    """An SDK client as an application would make one: boto3's default retries."""
    return boto3.client("sqs", endpoint_url=url, region_name="eu-central-1",
                        aws_access_key_id="x", aws_secret_access_key="x",
                        config=Config(read_timeout=60))


class Load:
    """Senders and receivers, a pair per queue, all through one endpoint."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.lock = threading.Lock()
        self.acked: set[str] = set()
        self.received: set[str] = set()
        self.deleted_at: dict[str, float] = {}
        self.again_after_delete: list[str] = []
        self.failures: list[BaseException] = []
        self.stop_sending = threading.Event()
        self.stop_receiving = threading.Event()

    def send(self, url: str) -> None:
        sqs = sdk(self.endpoint)
        n = 0
        while not self.stop_sending.is_set():
            try:
                out = sqs.send_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(k), "MessageBody": f"{url}-{n}-{k}"} for k in range(5)])
            except BaseException as exc:  # any failure fails the test
                self.failures.append(exc)
                return
            assert not out.get("Failed"), out
            with self.lock:
                self.acked.update(m["MessageId"] for m in out["Successful"])
            n += 1
            time.sleep(random.uniform(0, 0.05))

    def receive(self, url: str) -> None:
        sqs = sdk(self.endpoint)
        while not self.stop_receiving.is_set():
            try:
                got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                          WaitTimeSeconds=1).get("Messages", [])
                if got:
                    self._seen(got)
                    out = sqs.delete_message_batch(QueueUrl=url, Entries=[
                        {"Id": str(k), "ReceiptHandle": m["ReceiptHandle"]}
                        for k, m in enumerate(got)])
                    assert not out.get("Failed"), out
                    answered = time.monotonic()
                    with self.lock:
                        for m in got:
                            self.deleted_at.setdefault(m["MessageId"], answered)
            except BaseException as exc:
                self.failures.append(exc)
                return

    def _seen(self, got: list[dict[str, str]]) -> None:
        now = time.monotonic()
        with self.lock:
            for m in got:
                self.received.add(m["MessageId"])
                if self.deleted_at.get(m["MessageId"], now) < now:
                    self.again_after_delete.append(m["MessageId"])

    def drained(self) -> bool:
        with self.lock:
            return self.acked <= self.received and self.acked <= self.deleted_at.keys()


def test_a_node_sigkilled_under_sdk_load_loses_nothing_acknowledged(nodes):
    a, b = nodes
    owners = wait_settled([a, b], PARTITIONS)
    assert b.url in owners.values()
    tag = uuid.uuid4().hex[:6]
    names = []  # a queue in each partition: on both nodes
    for p in sorted(owners):
        names += queues_in_partition(p, PARTITIONS, 1, f"load{tag}-{p}")
    urls = [sdk(a.url).create_queue(
        QueueName=q, Attributes={"VisibilityTimeout": str(VISIBILITY_S)})["QueueUrl"]
        for q in names]
    load = Load(a.url)
    threads = [threading.Thread(target=load.send, args=(u,)) for u in urls]
    threads += [threading.Thread(target=load.receive, args=(u,)) for u in urls]
    for t in threads:
        t.start()
    try:
        time.sleep(2 + random.uniform(0, 1))
        b.kill()
        time.sleep(6)
        load.stop_sending.set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not load.failures and not load.drained():
            time.sleep(0.2)
    finally:
        load.stop_sending.set()
        load.stop_receiving.set()
        for t in threads:
            t.join(90)
    assert not load.failures, load.failures[:3]
    assert load.acked, "nothing was sent"
    assert load.acked - load.received == set(), "acknowledged messages never received"
    assert load.again_after_delete == []
