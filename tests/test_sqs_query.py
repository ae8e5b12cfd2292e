"""The SQS query protocol (docs/sqs.md) driven by boto3 speaking it (form bodies, XML answers;
tests/sqs_query.py) against one real node: queues and attributes, sends with attributes,
batches, receives with attribute names, change visibility, deletes, a FIFO group, listing and
errors, each answer equal to what the JSON 1.0 route answers for the same calls."""

import hashlib
import json
import uuid

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError

from tests.sqs_query import query_client

BODY = "line one\r\nline <two> & 'three'\r é 😀"
ATTRIBUTES = {"s": {"DataType": "String", "StringValue": "a\r\nb <&>"},
              "n": {"DataType": "Number.int", "StringValue": "42"},
              "b": {"DataType": "Binary", "BinaryValue": b"\x00\r\xff"}}
TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
# What differs between two sends of the same message: ids, handles and times.
VARYING = ("MessageId", "ReceiptHandle", "SentTimestamp", "ApproximateFirstReceiveTimestamp",
           "SequenceNumber")


@pytest.fixture(scope="module")
def query(node):
    return query_client(node.url)


@pytest.fixture(scope="module")
def sqs(node):
    return boto3.client("sqs", endpoint_url=node.url, region_name="us-east-1",
                        aws_access_key_id="x", aws_secret_access_key="x",
                        config=Config(retries={"max_attempts": 2}, read_timeout=60))


def name(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def code_of(info):
    return info.value.response["Error"]["Code"]


def same(answer):
    """An answer without what differs between two sends (nor the request's metadata)."""
    if isinstance(answer, dict):
        return {k: same(v) for k, v in answer.items()
                if k not in VARYING and k != "ResponseMetadata"}
    if isinstance(answer, list):
        return [same(v) for v in answer]
    return answer


def both(query, sqs, method, **kwargs):
    """A call through either protocol, with `{}` in string arguments standing for the
    protocol ("query" or "json") so that each works on its own queues."""
    def fill(value, tag):
        if isinstance(value, str):
            return value.replace("{}", tag)
        if isinstance(value, dict):
            return {k: fill(v, tag) for k, v in value.items()}
        if isinstance(value, list):
            return [fill(v, tag) for v in value]
        return value
    return (getattr(query, method)(**fill(kwargs, "query")),
            getattr(sqs, method)(**fill(kwargs, "json")))


def test_a_queue_and_its_messages_go_round_as_through_json(query, sqs, node):
    base = name("qp")
    urls = {}
    for tag, client in (("query", query), ("json", sqs)):
        urls[tag] = client.create_queue(QueueName=f"{base}-{tag}", Attributes={
            "VisibilityTimeout": "40", "MaximumMessageSize": "2048"})["QueueUrl"]
    assert urls["query"] == f"{node.url}/000000000000/{base}-query"
    assert query.get_queue_url(QueueName=f"{base}-query")["QueueUrl"] == urls["query"]
    url = f"{node.url}/000000000000/{base}-{{}}"
    q, j = both(query, sqs, "set_queue_attributes", QueueUrl=url,
                Attributes={"DelaySeconds": "0", "ReceiveMessageWaitTimeSeconds": "1"})
    q, j = both(query, sqs, "get_queue_attributes", QueueUrl=url, AttributeNames=["All"])
    varying = ("QueueArn", "CreatedTimestamp", "LastModifiedTimestamp")
    assert {k: v for k, v in q["Attributes"].items() if k not in varying} == {
        k: v for k, v in j["Attributes"].items() if k not in varying}
    assert q["Attributes"]["VisibilityTimeout"] == "40"
    assert q["Attributes"]["ReceiveMessageWaitTimeSeconds"] == "1"
    # a send with attributes, a trace header and characters XML must escape
    q, j = both(query, sqs, "send_message", QueueUrl=url, MessageBody=BODY,
                MessageAttributes=ATTRIBUTES, MessageSystemAttributes={
                    "AWSTraceHeader": {"DataType": "String", "StringValue": TRACE}})
    assert same(q) == same(j)
    assert q["MD5OfMessageBody"] == hashlib.md5(BODY.encode()).hexdigest()
    q, j = both(query, sqs, "send_message_batch", QueueUrl=url, Entries=[
        {"Id": "a", "MessageBody": "two", "DelaySeconds": 0},
        {"Id": "b", "MessageBody": "three", "MessageAttributes": {"k": ATTRIBUTES["s"]}},
        {"Id": "c", "MessageBody": "x", "DelaySeconds": 1000}])
    assert same(q) == same(j)
    assert [e["Id"] for e in q["Successful"]] == ["a", "b"]
    assert q["Failed"][0]["Id"] == "c" and q["Failed"][0]["SenderFault"] is True
    assert q["Failed"][0]["Code"] == "InvalidParameterValue"
    q, j = both(query, sqs, "receive_message", QueueUrl=url, MaxNumberOfMessages=10,
                AttributeNames=["All"], MessageAttributeNames=["All"], WaitTimeSeconds=2)
    received = sorted(q["Messages"], key=lambda m: m["Body"])
    assert same(received) == same(sorted(j["Messages"], key=lambda m: m["Body"]))
    assert [m["Body"] for m in received] == [BODY, "three", "two"]
    first = received[0]
    assert first["MessageAttributes"] == ATTRIBUTES  # the \r and the binary come back whole
    assert first["Attributes"]["AWSTraceHeader"] == TRACE
    assert first["Attributes"]["ApproximateReceiveCount"] == "1"
    # change visibility (one back at once, one garbage), then delete in a batch
    changed = query.change_message_visibility_batch(QueueUrl=urls["query"], Entries=[
        {"Id": "x", "ReceiptHandle": first["ReceiptHandle"], "VisibilityTimeout": 0},
        {"Id": "y", "ReceiptHandle": "garbage", "VisibilityTimeout": 0}])
    assert [e["Id"] for e in changed["Successful"]] == ["x"]
    assert changed["Failed"][0]["Code"] == "ReceiptHandleIsInvalid"
    [again] = query.receive_message(QueueUrl=urls["query"], AttributeNames=[
        "ApproximateReceiveCount"], WaitTimeSeconds=2)["Messages"]
    assert (again["Body"], again["Attributes"]) == (BODY, {"ApproximateReceiveCount": "2"})
    query.change_message_visibility(QueueUrl=urls["query"],
                                    ReceiptHandle=again["ReceiptHandle"], VisibilityTimeout=60)
    deleted = query.delete_message_batch(QueueUrl=urls["query"], Entries=[
        {"Id": "1", "ReceiptHandle": again["ReceiptHandle"]},
        {"Id": "2", "ReceiptHandle": received[1]["ReceiptHandle"]},
        {"Id": "3", "ReceiptHandle": "vq1.!!"}])
    assert [e["Id"] for e in deleted["Successful"]] == ["1", "2"]
    assert deleted["Failed"][0]["Id"] == "3"
    query.delete_message(QueueUrl=urls["query"], ReceiptHandle=received[2]["ReceiptHandle"])
    q, j = both(query, sqs, "get_queue_attributes", QueueUrl=url, AttributeNames=[
        "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
    assert q["Attributes"] == {"ApproximateNumberOfMessages": "0",
                               "ApproximateNumberOfMessagesNotVisible": "0"}
    assert query.receive_message(QueueUrl=urls["query"]).get("Messages", []) == []
    # listing, page by page, as JSON lists
    q, j = both(query, sqs, "list_queues", QueueNamePrefix=base)
    assert q["QueueUrls"] == j["QueueUrls"] == sorted(urls.values())
    page = query.list_queues(QueueNamePrefix=base, MaxResults=1)
    rest = query.list_queues(QueueNamePrefix=base, MaxResults=1, NextToken=page["NextToken"])
    assert page["QueueUrls"] + rest["QueueUrls"] == q["QueueUrls"] and "NextToken" not in rest
    query.purge_queue(QueueUrl=urls["query"])
    query.delete_queue(QueueUrl=urls["query"])
    assert query.list_queues(QueueNamePrefix=base)["QueueUrls"] == [urls["json"]]


def test_a_fifo_group_comes_in_order(query):
    url = query.create_queue(QueueName=name("qfifo") + ".fifo", Attributes={
        "FifoQueue": "true", "ContentBasedDeduplication": "true"})["QueueUrl"]
    first = query.send_message(QueueUrl=url, MessageBody="a1", MessageGroupId="a")
    sent = query.send_message_batch(QueueUrl=url, Entries=[
        {"Id": "1", "MessageBody": "a2", "MessageGroupId": "a"},
        {"Id": "2", "MessageBody": "b1", "MessageGroupId": "b"},
        {"Id": "3", "MessageBody": "a1", "MessageGroupId": "a"}])  # content-deduplicated
    assert sent["Successful"][2]["MessageId"] == first["MessageId"]
    assert int(first["SequenceNumber"]) < int(sent["Successful"][0]["SequenceNumber"])
    got = query.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30,
                                AttributeNames=["MessageGroupId", "MessageDeduplicationId"],
                                ReceiveRequestAttemptId="attempt-1")["Messages"]
    assert [m["Body"] for m in got] == ["a1", "b1"]  # a2 waits for a1
    assert got[0]["Attributes"] == {"MessageGroupId": "a", "MessageDeduplicationId":
                                    hashlib.sha256(b"a1").hexdigest()}
    for m in got:
        query.delete_message(QueueUrl=url, ReceiptHandle=m["ReceiptHandle"])
    rest = query.receive_message(QueueUrl=url, MaxNumberOfMessages=10)["Messages"]
    assert [m["Body"] for m in rest] == ["a2"]


def test_errors_carry_the_query_protocols_codes(query, node):
    with pytest.raises(query.exceptions.QueueDoesNotExist) as info:
        query.get_queue_url(QueueName="nope-none")
    assert code_of(info) == "AWS.SimpleQueueService.NonExistentQueue"
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    url = query.create_queue(QueueName=name("qerr"))["QueueUrl"]
    for call, code in (
            (lambda: query.send_message_batch(QueueUrl=url, Entries=[]),
             "AWS.SimpleQueueService.EmptyBatchRequest"),
            (lambda: query.send_message(QueueUrl=url, MessageBody="x", DelaySeconds=901),
             "InvalidParameterValue"),
            (lambda: query.create_queue(QueueName="x", Attributes={"Policy": "{}"}),
             "AWS.SimpleQueueService.UnsupportedOperation"),
            (lambda: query.get_queue_attributes(QueueUrl=url, AttributeNames=["Nope"]),
             "InvalidAttributeName"),
            (lambda: query.tag_queue(QueueUrl=url, Tags={"a": "b"}),
             "AWS.SimpleQueueService.UnsupportedOperation"),
            (lambda: query.delete_message(QueueUrl=url, ReceiptHandle="bad"),
             "ReceiptHandleIsInvalid")):
        with pytest.raises(ClientError) as info:
            call()
        assert code_of(info) == code
    with pytest.raises(ClientError) as info:
        query.create_queue(QueueName=url.rsplit("/", 1)[1], Attributes={
            "VisibilityTimeout": "7"})
    assert code_of(info) == "QueueAlreadyExists"
    assert json.loads(json.dumps(query.list_queues(QueueNamePrefix="none-such-")))[
        "ResponseMetadata"]["HTTPStatusCode"] == 200
