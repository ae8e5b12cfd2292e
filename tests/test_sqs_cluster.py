"""The SQS API on two nodes with auth on (docs/sqs.md): an SDK that knows one node's endpoint
reaches every queue (calls are sent on to the queue's owner, which verifies their SigV4
signatures), ListQueues lists the whole cluster, and a node SIGKILLed under SDK calls costs no
acknowledged message: calls for its partitions are held until the other node has taken them
over, then succeed."""

import json
import os
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.sqs_query import query_client
from tests.support import create_topics, queues_in_partition, start_cluster, wait_settled

PARTITIONS = 8


SECRET = "cluster-secret/+="


@pytest.fixture(scope="module")
def cluster(default_bootstrap, tmp_path_factory):
    keys = tmp_path_factory.mktemp("sqs") / "keys.json"
    keys.write_text(json.dumps({"keys": [{"id": "AKIDTEST", "secret": SECRET, "name": "tests",
                                          "scopes": {"read": [""], "write": [""],
                                                     "admin": [""]}}]}))
    os.chmod(keys, 0o600)
    env = {"VQ_AUTH": "true", "VQ_SQS_ACCESS_KEY_FILE": str(keys)}
    t = create_topics(default_bootstrap, partitions=PARTITIONS)
    nodes = start_cluster(t, 2, env={0: env, 1: env})
    try:
        yield nodes
    finally:
        for n in nodes:
            n.terminate()


def client(url, attempts=1, secret=SECRET):
    """An SDK client that does not retry by itself (max_attempts 1): what it gets is what the
    node answered."""
    return boto3.client("sqs", endpoint_url=url, region_name="eu-central-1",
                        aws_access_key_id="AKIDTEST", aws_secret_access_key=secret,
                        config=Config(retries={"max_attempts": attempts, "mode": "standard"},
                                      read_timeout=60))


def one_by_one(sqs, prefix):
    """ListQueues a page of one at a time, following NextToken to its end."""
    seen, token = [], None
    while True:
        page = sqs.list_queues(QueueNamePrefix=prefix, MaxResults=1,
                               **({"NextToken": token} if token else {}))
        seen += page["QueueUrls"]
        token = page.get("NextToken")
        if token is None:
            return seen


def names_on(owners, node, count, prefix):
    """`count` queue names under `prefix` whose partitions `node` owns."""
    out = []
    for p in sorted(p for p, url in owners.items() if url == node.url):
        out += queues_in_partition(p, PARTITIONS, 1, f"{prefix}-{p}")
        if len(out) == count:
            break
    return out


def test_one_endpoint_reaches_every_queue_and_lists_the_cluster(cluster):
    a, b = cluster
    owners = wait_settled([a, b], PARTITIONS)
    prefix = f"lst{uuid.uuid4().hex[:6]}"
    # a's names sort before b's: a page of b's names that b answers cut short must not end
    # the listing
    mine, theirs = names_on(owners, a, 2, f"{prefix}-a"), names_on(owners, b, 2, f"{prefix}-b")
    sqs = client(a.url)
    urls = {q: sqs.create_queue(QueueName=q)["QueueUrl"] for q in mine + theirs}
    assert all(u == f"{a.url}/000000000000/{q}" for q, u in urls.items())  # a's endpoint
    q = theirs[0]
    assert sqs.get_queue_url(QueueName=q)["QueueUrl"] == urls[q]
    sent = sqs.send_message(QueueUrl=urls[q], MessageBody="far",
                            MessageAttributes={"k": {"DataType": "String", "StringValue": "v"}})
    [m] = sqs.receive_message(QueueUrl=urls[q], WaitTimeSeconds=5, AttributeNames=["SenderId"],
                              MessageAttributeNames=["All"])["Messages"]
    assert (m["MessageId"], m["MD5OfMessageAttributes"]) == (
        sent["MessageId"], sent["MD5OfMessageAttributes"])
    assert m["Attributes"] == {"SenderId": "AKIDTEST"}  # the key verified on the owner
    sqs.delete_message(QueueUrl=urls[q], ReceiptHandle=m["ReceiptHandle"])
    # the same queue through the other node, by the same URL
    assert client(b.url).receive_message(QueueUrl=urls[q]).get("Messages", []) == []
    listed = sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"]
    assert listed == sorted(urls.values())
    assert one_by_one(sqs, prefix) == listed
    assert client(b.url).list_queues(QueueNamePrefix=prefix)["QueueUrls"] == [
        u.replace(a.url, b.url) for u in listed]
    # a wrong secret: refused (every node verifies a call before it acts or sends it on)
    with pytest.raises(ClientError) as info:
        client(a.url, secret="wrong").send_message(QueueUrl=urls[q], MessageBody="x")
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as info:
        client(a.url, secret="wrong").list_queues()
    assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_the_query_protocol_reaches_every_queue_signed_and_lists_the_cluster(cluster):
    """The same through an SDK of the query protocol (form bodies, signed; XML answers)."""
    a, b = cluster
    owners = wait_settled([a, b], PARTITIONS)
    prefix = f"qry{uuid.uuid4().hex[:6]}"
    mine, theirs = names_on(owners, a, 1, f"{prefix}-a"), names_on(owners, b, 2, f"{prefix}-b")
    sqs = query_client(a.url, "AKIDTEST", SECRET, attempts=1, region="eu-central-1")
    urls = {q: sqs.create_queue(QueueName=q, Attributes={"VisibilityTimeout": "40"})[
        "QueueUrl"] for q in mine + theirs}
    assert all(u == f"{a.url}/000000000000/{q}" for q, u in urls.items())
    far = urls[theirs[0]]
    attributes = {"k": {"DataType": "String", "StringValue": "v\r\n"}}
    sent = sqs.send_message(QueueUrl=far, MessageBody="far\r\n", MessageAttributes=attributes)
    [m] = sqs.receive_message(QueueUrl=far, WaitTimeSeconds=5, AttributeNames=["SenderId"],
                              MessageAttributeNames=["All"])["Messages"]
    assert (m["MessageId"], m["Body"], m["MessageAttributes"]) == (
        sent["MessageId"], "far\r\n", attributes)
    assert m["Attributes"] == {"SenderId": "AKIDTEST"}  # the key verified on the owner
    sqs.delete_message(QueueUrl=far, ReceiptHandle=m["ReceiptHandle"])
    assert sqs.get_queue_attributes(QueueUrl=far, AttributeNames=["VisibilityTimeout"])[
        "Attributes"] == {"VisibilityTimeout": "40"}
    listed = sqs.list_queues(QueueNamePrefix=prefix)["QueueUrls"]
    assert listed == sorted(urls.values())
    assert client(a.url).list_queues(QueueNamePrefix=prefix)["QueueUrls"] == listed
    assert one_by_one(sqs, prefix) == listed
    wrong = query_client(a.url, "AKIDTEST", "wrong", attempts=1)
    for call in (lambda: wrong.send_message(QueueUrl=far, MessageBody="x"),
                 lambda: wrong.list_queues()):
        with pytest.raises(ClientError) as info:
            call()
        assert info.value.response["Error"]["Code"] == "SignatureDoesNotMatch"


def test_calls_for_a_killed_nodes_queues_are_held_until_they_move(cluster):
    """...and what the dead node answered stays: the queue's attributes, every acknowledged
    message, and a received message's receive count (durable grants: it never goes down)."""
    a, b = cluster
    owners = wait_settled([a, b], PARTITIONS)
    [q] = names_on(owners, b, 1, f"kill{uuid.uuid4().hex[:6]}")
    sqs = client(a.url)
    url = sqs.create_queue(QueueName=q, Attributes={"VisibilityTimeout": "45",
                                                    "ReceiveMessageWaitTimeSeconds": "1"}
                           )["QueueUrl"]
    before = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    acked = [sqs.send_message(QueueUrl=url, MessageBody=f"m{i}")["MessageId"]
             for i in range(5)]
    [first] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1)["Messages"]
    b.kill()
    # a's map still names b: the calls wait for the group to move b's partitions to a
    acked.append(sqs.send_message(QueueUrl=url, MessageBody="m5")["MessageId"])
    after = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    kept = ("VisibilityTimeout", "ReceiveMessageWaitTimeSeconds", "CreatedTimestamp",
            "DelaySeconds", "QueueArn")
    assert {k: after[k] for k in kept} == {k: before[k] for k in kept}
    got: dict[str, str] = {}
    while len(got) < 6:
        page = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=2,
                                   AttributeNames=["ApproximateReceiveCount"])
        for m in page.get("Messages", []):
            got[m["MessageId"]] = m["Attributes"]["ApproximateReceiveCount"]
            sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    assert sorted(got) == sorted(acked)
    assert got[first["MessageId"]] == "2"
