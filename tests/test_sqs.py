"""The SQS-compatible API (docs/sqs.md) driven by boto3 against one real node: queues and
their attributes, the message cycle, batches, change visibility, redrive after
maxReceiveCount, FIFO groups in order, deduplication ids, long polling, delays and purges."""

import hashlib
import json
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.support import http

pytestmark = pytest.mark.both_brokers


@pytest.fixture(scope="module")
def sqs(node):
    return boto3.client(
        "sqs", endpoint_url=node.url, region_name="us-east-1", aws_access_key_id="x",
        aws_secret_access_key="x", config=Config(retries={"max_attempts": 2},
                                                 read_timeout=30))


def name(prefix="q"):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def code_of(info):
    return info.value.response["Error"]["Code"]


def md5(text):
    return hashlib.md5(text.encode()).hexdigest()


def md5_of_trace(value):
    """MD5OfMessageSystemAttributes of an AWSTraceHeader, by AWS's algorithm for message
    attributes: name, type and value each with a 4-byte length, transport 1 (a string)."""
    def field(data):
        return len(data).to_bytes(4, "big") + data
    return hashlib.md5(field(b"AWSTraceHeader") + field(b"String") + b"\x01"
                       + field(value.encode())).hexdigest()


def test_queues_are_created_listed_described_changed_and_deleted(sqs, node):
    base = name("life")
    urls = [sqs.create_queue(QueueName=f"{base}-{i}")["QueueUrl"] for i in range(3)]
    assert urls[0] == f"{node.url}/000000000000/{base}-0"
    assert sqs.get_queue_url(QueueName=f"{base}-1")["QueueUrl"] == urls[1]
    assert sqs.create_queue(QueueName=f"{base}-0")["QueueUrl"] == urls[0]  # the same again
    assert sqs.list_queues(QueueNamePrefix=base)["QueueUrls"] == urls
    page = sqs.list_queues(QueueNamePrefix=base, MaxResults=2)
    assert page["QueueUrls"] == urls[:2]
    rest = sqs.list_queues(QueueNamePrefix=base, MaxResults=2, NextToken=page["NextToken"])
    assert rest["QueueUrls"] == urls[2:] and "NextToken" not in rest
    attrs = sqs.get_queue_attributes(QueueUrl=urls[0], AttributeNames=["All"])["Attributes"]
    assert {k: attrs[k] for k in ("VisibilityTimeout", "DelaySeconds", "MaximumMessageSize",
                                  "MessageRetentionPeriod", "ReceiveMessageWaitTimeSeconds",
                                  "ApproximateNumberOfMessages")} == {
        "VisibilityTimeout": "30", "DelaySeconds": "0", "MaximumMessageSize": "262144",
        "MessageRetentionPeriod": "345600", "ReceiveMessageWaitTimeSeconds": "0",
        "ApproximateNumberOfMessages": "0"}
    assert attrs["QueueArn"] == f"arn:aws:sqs:us-east-1:000000000000:{base}-0"
    assert "FifoQueue" not in attrs and int(attrs["CreatedTimestamp"]) > 1_700_000_000
    sqs.set_queue_attributes(QueueUrl=urls[0], Attributes={"VisibilityTimeout": "45",
                                                           "DelaySeconds": "2"})
    got = sqs.get_queue_attributes(QueueUrl=urls[0],
                                   AttributeNames=["VisibilityTimeout", "DelaySeconds"])
    assert got["Attributes"] == {"VisibilityTimeout": "45", "DelaySeconds": "2"}
    with pytest.raises(ClientError) as info:
        sqs.create_queue(QueueName=f"{base}-0", Attributes={"VisibilityTimeout": "10"})
    assert code_of(info) == "QueueAlreadyExists"
    # the queue's lease consumer, seen through vqueues' own API
    status, consumer = http("GET", f"{node.url}/v1/queues/{base}-0/consumers/sqs")
    assert status == 200 and consumer["visibility_ms"] == 45_000
    assert consumer["mode"] == "lease" and consumer["durable_grants"] is True
    sqs.delete_queue(QueueUrl=urls[0])
    with pytest.raises(ClientError) as info:
        sqs.get_queue_url(QueueName=f"{base}-0")
    assert code_of(info) == "AWS.SimpleQueueService.NonExistentQueue"
    assert sqs.list_queues(QueueNamePrefix=base)["QueueUrls"] == urls[1:]
    for bad in ("has space", "x" * 81, "dot.ted", "a" * 76 + ".fifo.fifo"):
        with pytest.raises(ClientError) as info:
            sqs.create_queue(QueueName=bad)
        assert code_of(info) == "InvalidParameterValue"


def test_a_message_goes_round_with_its_attributes_and_digests(sqs, node):
    url = sqs.create_queue(QueueName=name("cycle"))["QueueUrl"]
    attributes = {"s": {"DataType": "String", "StringValue": "héllo"},
                  "n": {"DataType": "Number.int", "StringValue": "42"},
                  "b": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"}}
    trace = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
    sent = sqs.send_message(QueueUrl=url, MessageBody="body ü", MessageAttributes=attributes,
                            MessageSystemAttributes={"AWSTraceHeader": {
                                "DataType": "String", "StringValue": trace}})
    assert sent["MD5OfMessageBody"] == md5("body ü")
    assert sent["MD5OfMessageSystemAttributes"] == md5_of_trace(trace)
    uuid.UUID(sent["MessageId"])
    got = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["All"],
                              MessageSystemAttributeNames=["All"], WaitTimeSeconds=1)
    [m] = got["Messages"]
    assert m["Body"] == "body ü" and m["MessageId"] == sent["MessageId"]
    assert m["MD5OfBody"] == sent["MD5OfMessageBody"]
    assert m["MD5OfMessageAttributes"] == sent["MD5OfMessageAttributes"]
    assert m["MessageAttributes"] == attributes
    assert m["Attributes"]["ApproximateReceiveCount"] == "1"
    assert m["Attributes"]["AWSTraceHeader"] == trace
    assert m["Attributes"]["SenderId"] == "x"  # the key id the send was signed with
    assert abs(int(m["Attributes"]["SentTimestamp"]) - time.time() * 1000) < 60_000
    first = int(m["Attributes"]["ApproximateFirstReceiveTimestamp"])
    assert int(m["Attributes"]["SentTimestamp"]) <= first <= time.time() * 1000
    # only what was asked for, with its own digest
    sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                  VisibilityTimeout=0)
    again = sqs.receive_message(QueueUrl=url, MessageAttributeNames=["s"], AttributeNames=[
        "ApproximateReceiveCount", "ApproximateFirstReceiveTimestamp"])["Messages"][0]
    assert again["MessageAttributes"] == {"s": attributes["s"]}
    assert again["Attributes"] == {"ApproximateReceiveCount": "2",
                                   "ApproximateFirstReceiveTimestamp": str(first)}
    assert again["MD5OfMessageAttributes"] != m["MD5OfMessageAttributes"]
    # the raw record, through vqueues' own API
    status, page = http("GET", f"{node.url}/v1/queues/{url.rsplit('/', 1)[1]}/records")
    assert status == 200 and page["records"][0]["value"] == "body ü"
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])
    sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])  # an old handle: fine
    sqs.delete_message(QueueUrl=url, ReceiptHandle=again["ReceiptHandle"])  # again: fine
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []
    with pytest.raises(ClientError) as info:
        sqs.delete_message(QueueUrl=url, ReceiptHandle="not-a-handle")
    assert code_of(info) == "ReceiptHandleIsInvalid"
    with pytest.raises(ClientError) as info:
        sqs.change_message_visibility(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"],
                                      VisibilityTimeout=5)
    assert code_of(info) == "AWS.SimpleQueueService.MessageNotInflight"


def test_batches_answer_entry_by_entry(sqs):
    url = sqs.create_queue(QueueName=name("batch"))["QueueUrl"]
    sent = sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "one"}, {"Id": "b", "MessageBody": "two"},
        {"Id": "c", "MessageBody": "three", "DelaySeconds": 1000}])
    assert [e["Id"] for e in sent["Successful"]] == ["a", "b"]
    assert sent["Failed"][0]["Id"] == "c" and sent["Failed"][0]["SenderFault"] is True
    assert sent["Failed"][0]["Code"] == "InvalidParameterValue"
    for entries, code in (([], "AWS.SimpleQueueService.EmptyBatchRequest"),
                          ([{"Id": f"e{i}", "MessageBody": "x"} for i in range(11)],
                           "AWS.SimpleQueueService.TooManyEntriesInBatchRequest"),
                          ([{"Id": "a", "MessageBody": "x"}] * 2,
                           "AWS.SimpleQueueService.BatchEntryIdsNotDistinct"),
                          ([{"Id": "a b", "MessageBody": "x"}],
                           "AWS.SimpleQueueService.InvalidBatchEntryId")):
        with pytest.raises(ClientError) as info:
            sqs.send_message_batch(QueueUrl=url, Entries=entries)
        assert code_of(info) == code
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60,
                              WaitTimeSeconds=1)["Messages"]
    assert sorted(m["Body"] for m in got) == ["one", "two"]
    changed = sqs.change_message_visibility_batch(QueueUrl=url, Entries=[
        {"Id": "x", "ReceiptHandle": got[0]["ReceiptHandle"], "VisibilityTimeout": 0},
        {"Id": "y", "ReceiptHandle": "garbage", "VisibilityTimeout": 0}])
    assert [e["Id"] for e in changed["Successful"]] == ["x"]
    assert changed["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    back = sqs.receive_message(QueueUrl=url, VisibilityTimeout=60)["Messages"]
    assert [m["Body"] for m in back] == [got[0]["Body"]]
    deleted = sqs.delete_message_batch(QueueUrl=url, Entries=[
        {"Id": "1", "ReceiptHandle": back[0]["ReceiptHandle"]},
        {"Id": "2", "ReceiptHandle": got[1]["ReceiptHandle"]},
        {"Id": "3", "ReceiptHandle": got[0]["ReceiptHandle"]},  # superseded: no error
        {"Id": "4", "ReceiptHandle": "vq1.!!"}])
    assert [e["Id"] for e in deleted["Successful"]] == ["1", "2", "3"]
    assert deleted["Failed"][0]["Id"] == "4"
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    assert attrs["Attributes"] == {"ApproximateNumberOfMessages": "0",
                                   "ApproximateNumberOfMessagesNotVisible": "0"}


def test_a_message_received_max_receive_count_times_goes_to_the_dead_letter_queue(sqs):
    dead = sqs.create_queue(QueueName=name("dead"))["QueueUrl"]
    dead_arn = sqs.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"]
                                        )["Attributes"]["QueueArn"]
    policy = json.dumps({"deadLetterTargetArn": dead_arn, "maxReceiveCount": 2})
    url = sqs.create_queue(QueueName=name("redrive"),
                           Attributes={"RedrivePolicy": policy})["QueueUrl"]
    got = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["RedrivePolicy"])
    assert json.loads(got["Attributes"]["RedrivePolicy"]) == {
        "deadLetterTargetArn": dead_arn, "maxReceiveCount": 2}
    sent = sqs.send_message(QueueUrl=url, MessageBody="poison")
    counts = []
    for _ in range(2):
        m = sqs.receive_message(QueueUrl=url, VisibilityTimeout=1, WaitTimeSeconds=5,
                                AttributeNames=["ApproximateReceiveCount"])["Messages"][0]
        counts.append(m["Attributes"]["ApproximateReceiveCount"])
    assert counts == ["1", "2"]
    moved = sqs.receive_message(QueueUrl=dead, WaitTimeSeconds=10,
                                MessageSystemAttributeNames=["DeadLetterQueueSourceArn"])
    [m] = moved["Messages"]
    assert (m["Body"], m["MessageId"]) == ("poison", sent["MessageId"])
    assert m["Attributes"]["DeadLetterQueueSourceArn"].endswith(":" + url.rsplit("/", 1)[1])
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []


def test_fifo_groups_come_in_order_and_deduplication_ids_write_once(sqs):
    url = sqs.create_queue(QueueName=name("order") + ".fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    first = sqs.send_message(QueueUrl=url, MessageBody="a1", MessageGroupId="a")
    sqs.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "1", "MessageBody": "a2", "MessageGroupId": "a"},
        {"Id": "2", "MessageBody": "b1", "MessageGroupId": "b"},
        {"Id": "3", "MessageBody": "a1", "MessageGroupId": "a"}])  # content-deduplicated
    again = sqs.send_message(QueueUrl=url, MessageBody="other", MessageGroupId="a",
                             MessageDeduplicationId=hashlib.sha256(b"a1").hexdigest())
    assert again["MessageId"] == first["MessageId"]  # a repeated id, another body: the first
    got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30,
                              AttributeNames=["All"])["Messages"]
    assert [m["Body"] for m in got] == ["a1", "b1"]  # a2 waits for a1
    assert got[0]["Attributes"]["MessageGroupId"] == "a"
    assert got[0]["Attributes"]["MessageDeduplicationId"] == hashlib.sha256(b"a1").hexdigest()
    assert int(got[0]["Attributes"]["SequenceNumber"]) < int(
        got[1]["Attributes"]["SequenceNumber"])
    for m in got:
        sqs.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    rest = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in rest] == ["a2"]
    for kwargs, code in (({"MessageBody": "x"}, "MissingParameter"),
                         ({"MessageBody": "x", "MessageGroupId": "a", "DelaySeconds": 1},
                          "InvalidParameterValue")):
        with pytest.raises(ClientError) as info:
            sqs.send_message(QueueUrl=url, **kwargs)
        assert code_of(info) == code
    plain = sqs.create_queue(QueueName=name("plain"))["QueueUrl"]
    with pytest.raises(ClientError) as info:
        sqs.send_message(QueueUrl=plain, MessageBody="x", MessageDeduplicationId="d")
    assert code_of(info) == "InvalidParameterValue"


def test_a_fifo_receive_retried_with_its_attempt_id_answers_the_same_messages(sqs):
    url = sqs.create_queue(QueueName=name("attempt") + ".fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    for body in ("a1", "b1", "a2"):
        sqs.send_message(QueueUrl=url, MessageBody=body, MessageGroupId=body[0])

    def receive(attempt_id):
        got = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30,
                                  ReceiveRequestAttemptId=attempt_id)
        return [(m["Body"], m["ReceiptHandle"]) for m in got.get("Messages", [])]
    first = receive("attempt-1")
    assert [body for body, _ in first] == ["a1", "b1"]
    assert receive("attempt-1") == first  # the lost answer, again: same receipt handles
    assert receive("attempt-2") == []  # another receive: a2 waits for a1
    sqs.delete_message(QueueUrl=url, ReceiptHandle=first[0][1])
    assert [body for body, _ in receive("attempt-1")] == ["a2"]  # a1 deleted: a new receive
    with pytest.raises(ClientError) as info:
        receive("not ascii: é")
    assert code_of(info) == "InvalidParameterValue"


def test_a_long_poll_answers_when_a_message_comes(sqs):
    url = sqs.create_queue(QueueName=name("poll"))["QueueUrl"]
    with ThreadPoolExecutor(1) as pool:
        started = time.monotonic()
        waiting = pool.submit(sqs.receive_message, QueueUrl=url, WaitTimeSeconds=10)
        time.sleep(0.5)
        sqs.send_message(QueueUrl=url, MessageBody="late")
        got = waiting.result()
    assert [m["Body"] for m in got["Messages"]] == ["late"]
    assert time.monotonic() - started < 9


def test_delayed_messages_keep_their_id_and_a_purge_keeps_the_queue(sqs):
    url = sqs.create_queue(QueueName=name("delay"))["QueueUrl"]
    sent = sqs.send_message(QueueUrl=url, MessageBody="later", DelaySeconds=1)
    attrs = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessagesDelayed"])["Attributes"]
    assert attrs == {"ApproximateNumberOfMessagesDelayed": "1"}
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []
    [m] = sqs.receive_message(QueueUrl=url, WaitTimeSeconds=5)["Messages"]
    assert m["MessageId"] == sent["MessageId"]
    sqs.send_message_batch(QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": str(i)}
                                                  for i in range(3)])
    sqs.purge_queue(QueueUrl=url)
    assert sqs.receive_message(QueueUrl=url).get("Messages", []) == []
    sqs.send_message(QueueUrl=url, MessageBody="after")
    assert [m["Body"] for m in sqs.receive_message(QueueUrl=url, WaitTimeSeconds=2)[
        "Messages"]] == ["after"]


def test_errors_come_in_sqs_shapes(sqs, node):
    status, body, headers = raw(node, "AmazonSQS.GetQueueUrl", {"QueueName": "nope-none"})
    assert status == 400 and body["__type"] == "com.amazonaws.sqs#QueueDoesNotExist"
    assert headers["x-amzn-query-error"] == "AWS.SimpleQueueService.NonExistentQueue;Sender"
    status, body, headers = raw(node, "AmazonSQS.Frobnicate", {})
    assert status == 400 and headers["x-amzn-query-error"] == "InvalidAction;Sender"
    with pytest.raises(ClientError) as info:
        sqs.tag_queue(QueueUrl=f"{node.url}/000000000000/x", Tags={"a": "b"})
    assert code_of(info) == "AWS.SimpleQueueService.UnsupportedOperation"


def raw(node, target, body):
    import urllib.error
    import urllib.request
    req = urllib.request.Request(node.url + "/", data=json.dumps(body).encode(), headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": target}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()), dict(err.headers)
