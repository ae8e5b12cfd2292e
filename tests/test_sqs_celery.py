"""A Celery worker consuming tasks through kombu's SQS transport (docs/sqs.md) from a real
node: kombu 5.7.0 with botocore 1.44.8 speaks AWS JSON 1.0 on its synchronous (boto3) calls
and on its asynchronous receive path (pycurl), the only protocol the surface answers."""

import threading
import time
import uuid
from collections import Counter

import boto3
import pytest
from botocore.config import Config
from celery import Celery
from celery.contrib.testing.worker import start_worker

TASKS = 60

# kombu 5.7.0's curl client calls what pycurl 7.49.0 deprecates (IOCTLFUNCTION, socket_all);
# both still work.
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning:kombu.asynchronous.http.curl")


@pytest.fixture(scope="module")
def sqs(node):
    return boto3.client(
        "sqs", endpoint_url=node.url, region_name="us-east-1", aws_access_key_id="x",
        aws_secret_access_key="x", config=Config(retries={"max_attempts": 2}))


def test_a_celery_worker_runs_every_task_sent_through_kombus_sqs_transport_once(node, sqs):
    port = node.url.rsplit(":", 1)[1]
    queue = f"celery-{uuid.uuid4().hex[:10]}"
    app = Celery("vqueues_sqs_test", broker=f"sqs://x:x@127.0.0.1:{port}", set_as_current=False)
    app.conf.update(
        # kombu takes the endpoint from the broker URL's host and port; is_secure picks http.
        broker_transport_options={"region": "us-east-1", "is_secure": False,
                                  "wait_time_seconds": 1, "polling_interval": 0.1,
                                  "visibility_timeout": 60},
        broker_connection_retry_on_startup=False,
        task_default_queue=queue,
        worker_enable_remote_control=False,  # the pidbox needs fanout, which SQS lacks
        worker_hijack_root_logger=False,
    )
    ran: Counter[int] = Counter()
    lock = threading.Lock()

    def run(i: int) -> None:
        with lock:
            ran[i] += 1

    record = app.task(name="record")(run)

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        for i in range(TASKS):
            record.delay(i)
        deadline = time.monotonic() + 60
        while sum(ran.values()) < TASKS and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # a task run twice would show here
    assert ran == Counter(range(TASKS))  # each task ran, exactly once
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    attrs = sqs.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages",
                                      "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
    assert attrs == {"ApproximateNumberOfMessages": "0",
                     "ApproximateNumberOfMessagesNotVisible": "0"}
