"""A Celery worker consuming tasks through kombu's SQS transport (docs/sqs.md) from a real
node, with auth off and with auth on (its SigV4 signatures verified): kombu 5.7.0 with
botocore 1.44.8 speaks AWS JSON 1.0 on its synchronous (boto3) calls and on its asynchronous
receive path (pycurl), the only protocol the surface answers."""

import json
import os
import threading
import time
import uuid
from collections import Counter

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from celery import Celery
from celery.contrib.testing.worker import start_worker

from tests.support import NodeProcess, create_topics

TASKS = 60

# kombu 5.7.0's curl client calls what pycurl 7.49.0 deprecates (IOCTLFUNCTION, socket_all);
# both still work.
pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning:kombu.asynchronous.http.curl")


SECRET = "celery-secret"


@pytest.fixture(scope="module")
def auth_node(default_bootstrap, tmp_path_factory):
    """A node of its own with auth on and one access key reaching every queue."""
    keys = tmp_path_factory.mktemp("sqs") / "keys.json"
    keys.write_text(json.dumps({"keys": [{"id": "AKIDCELERY", "secret": SECRET,
                                          "name": "celery", "scopes": {
                                              "read": [""], "write": [""], "admin": [""]}}]}))
    os.chmod(keys, 0o600)
    n = NodeProcess(create_topics(default_bootstrap, partitions=4),
                    extra_env={"VQ_AUTH": "true", "VQ_SQS_ACCESS_KEY_FILE": str(keys)}).start()
    try:
        yield n
    finally:
        n.terminate()


def client(url, key_id="x", secret="x"):
    return boto3.client(
        "sqs", endpoint_url=url, region_name="us-east-1", aws_access_key_id=key_id,
        aws_secret_access_key=secret, config=Config(retries={"max_attempts": 2}))


def run_tasks_through_a_worker(url, key_id, secret):
    """Send TASKS tasks with .delay() to a worker consuming through kombu's SQS transport;
    assert each ran exactly once and the queue is empty after."""
    port = url.rsplit(":", 1)[1]
    queue = f"celery-{uuid.uuid4().hex[:10]}"
    app = Celery("vqueues_sqs_test", broker=f"sqs://{key_id}:{secret}@127.0.0.1:{port}",
                 set_as_current=False)
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

    record = app.task(name=f"record-{queue}")(run)

    with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=30):
        for i in range(TASKS):
            record.delay(i)
        deadline = time.monotonic() + 60
        while sum(ran.values()) < TASKS and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2)  # a task run twice would show here
    assert ran == Counter(range(TASKS))  # each task ran, exactly once
    sqs = client(url, key_id, secret)
    queue_url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    attrs = sqs.get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["ApproximateNumberOfMessages",
                                            "ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    assert attrs == {"ApproximateNumberOfMessages": "0",
                     "ApproximateNumberOfMessagesNotVisible": "0"}


def test_a_celery_worker_runs_every_task_sent_through_kombus_sqs_transport_once(node):
    run_tasks_through_a_worker(node.url, "x", "x")


def test_kombus_signed_calls_are_verified_with_auth_on(auth_node):
    run_tasks_through_a_worker(auth_node.url, "AKIDCELERY", SECRET)
    with pytest.raises(ClientError) as info:  # signatures are checked: a wrong secret is refused
        client(auth_node.url, "AKIDCELERY", "wrong").list_queues()
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
