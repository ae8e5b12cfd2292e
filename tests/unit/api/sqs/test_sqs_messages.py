"""What SQS answers beside a message, through the node's HTTP app over an in-memory node: the
AWSTraceHeader system attribute (sent, digested, received), SenderId,
ApproximateFirstReceiveTimestamp and ReceiveRequestAttemptId (docs/sqs.md)."""

import hashlib
import json

import pytest

pytestmark = pytest.mark.unit
JSON = "application/x-amz-json-1.0"
TRACE = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"


async def call(api, action, body, headers=None):
    resp = await api.post("/", data=json.dumps(body), headers={
        "Content-Type": JSON, "X-Amz-Target": f"AmazonSQS.{action}", **(headers or {})})
    return resp.status, json.loads(await resp.read()), resp.headers


async def ok(api, action, body, headers=None):
    status, answer, _ = await call(api, action, body, headers)
    assert status == 200, answer
    return answer


async def make(api, name, **attributes):
    return (await ok(api, "CreateQueue", {"QueueName": name, "Attributes": attributes}))[
        "QueueUrl"]


def field(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def trace_digest(value: str) -> str:
    """AWS's digest of message attributes, over the one system attribute sent."""
    return hashlib.md5(field(b"AWSTraceHeader") + field(b"String") + b"\x01"
                       + field(value.encode())).hexdigest()


def system(value=TRACE, data_type="String"):
    return {"AWSTraceHeader": {"DataType": data_type, "StringValue": value}}


async def test_a_trace_header_is_digested_kept_and_received_when_asked_for(api):
    url = await make(api, "traced")
    sent = await ok(api, "SendMessage", {"QueueUrl": url, "MessageBody": "hi",
                                         "MessageSystemAttributes": system()})
    assert sent["MD5OfMessageSystemAttributes"] == trace_digest(TRACE)
    assert "MD5OfMessageAttributes" not in sent
    plain = await ok(api, "SendMessage", {"QueueUrl": url, "MessageBody": "plain"})
    assert "MD5OfMessageSystemAttributes" not in plain
    batch = await ok(api, "SendMessageBatch", {"QueueUrl": url, "Entries": [
        {"Id": "a", "MessageBody": "b1", "MessageSystemAttributes": system("Root=1-abc-def")},
        {"Id": "b", "MessageBody": "b2"}]})
    assert [e.get("MD5OfMessageSystemAttributes") for e in batch["Successful"]] == [
        trace_digest("Root=1-abc-def"), None]
    got = await ok(api, "ReceiveMessage", {"QueueUrl": url, "MaxNumberOfMessages": 10,
                                           "AttributeNames": ["AWSTraceHeader"]})
    assert {m["Body"]: m.get("Attributes") for m in got["Messages"]} == {
        "hi": {"AWSTraceHeader": TRACE}, "plain": None,
        "b1": {"AWSTraceHeader": "Root=1-abc-def"}, "b2": None}
    for m in got["Messages"]:
        await ok(api, "ChangeMessageVisibility", {"QueueUrl": url, "VisibilityTimeout": 0,
                                                  "ReceiptHandle": m["ReceiptHandle"]})
    for ask in ({"MessageSystemAttributeNames": ["All"]},
                {"MessageSystemAttributeNames": ["AWSTraceHeader"]}, {}):
        got = await ok(api, "ReceiveMessage", {"QueueUrl": url, **ask})
        [m] = got["Messages"]
        assert m["Body"] == "hi"
        assert ("AWSTraceHeader" in m.get("Attributes", {})) == bool(ask)
        await ok(api, "ChangeMessageVisibility", {"QueueUrl": url, "VisibilityTimeout": 0,
                                                  "ReceiptHandle": m["ReceiptHandle"]})


async def test_a_trace_header_does_not_count_toward_the_message_size(api):
    url = await make(api, "small", MaximumMessageSize="1024")
    sent = await ok(api, "SendMessage", {"QueueUrl": url, "MessageBody": "x" * 1024,
                                         "MessageSystemAttributes": system("T" * 2000)})
    assert sent["MD5OfMessageSystemAttributes"] == trace_digest("T" * 2000)


@pytest.mark.parametrize("attributes", [
    {"SenderId": {"DataType": "String", "StringValue": "x"}},
    system(data_type="Number"), system(data_type="String.trace"),
    {"AWSTraceHeader": {"DataType": "Binary", "BinaryValue": "AAE="}},
    system(""), system("bad \x00 character"), {"AWSTraceHeader": "Root=1"}, ["AWSTraceHeader"],
])
async def test_system_attributes_other_than_a_string_trace_header_are_refused(api, attributes):
    url = await make(api, "refusing")
    status, answer, headers = await call(api, "SendMessage", {
        "QueueUrl": url, "MessageBody": "x", "MessageSystemAttributes": attributes})
    assert status == 400, answer
    assert headers["x-amzn-query-error"] in ("InvalidParameterValue;Sender",
                                             "InvalidMessageContents;Sender")
    batch = await ok(api, "SendMessageBatch", {"QueueUrl": url, "Entries": [
        {"Id": "a", "MessageBody": "x", "MessageSystemAttributes": attributes},
        {"Id": "b", "MessageBody": "y"}]})
    assert [e["Id"] for e in batch["Failed"]] == ["a"]
    assert [e["Id"] for e in batch["Successful"]] == ["b"]
