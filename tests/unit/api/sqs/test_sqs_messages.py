"""What SQS answers beside a message, through the node's HTTP app over an in-memory node: the
AWSTraceHeader system attribute (sent, digested, received), SenderId,
ApproximateFirstReceiveTimestamp and ReceiveRequestAttemptId (docs/sqs.md)."""

import asyncio
import hashlib
import json
import time

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.unit.api.sqs.signed import signed_app
from vqueues.api.keys import WORK
from vqueues.api.sqs.attempts import WINDOW_MS, Answered, Attempt, ReceiveAttempts
from vqueues.api.sqs.handles import decode_handle

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


def signed(api, action, body, key, secret="s"):
    """The headers botocore's signer gives the call, with the key's id and secret."""
    request = AWSRequest("POST", str(api.make_url("/")), data=json.dumps(body).encode(),
                         headers={"Content-Type": JSON, "X-Amz-Target": f"AmazonSQS.{action}"})
    SigV4Auth(Credentials(key, secret), "sqs", "us-east-1").add_auth(request)
    return dict(request.headers)


async def sent_by(api, url, send_key=None, key=None):
    """The SenderId a receiver is answered for a message sent signed with `send_key` (None:
    unsigned); `key` signs the other calls (None: unsigned)."""
    async def act(action, body, signer):
        return await ok(api, action, body, signer and signed(api, action, body, signer))
    await act("SendMessage", {"QueueUrl": url, "MessageBody": "x"}, send_key)
    got = await act("ReceiveMessage", {"QueueUrl": url, "MessageSystemAttributeNames": ["All"]},
                    key)
    [m] = got["Messages"]
    await act("DeleteMessage", {"QueueUrl": url, "ReceiptHandle": m["ReceiptHandle"]}, key)
    return m["Attributes"].get("SenderId")


async def test_with_auth_off_the_sender_id_is_the_key_id_the_send_was_signed_with(api):
    url = await make(api, "senders")
    assert await sent_by(api, url, "AKIDSENDER") == "AKIDSENDER"
    assert await sent_by(api, url) is None  # unsigned: no SenderId
    await ok(api, "SendMessage", {"QueueUrl": url, "MessageBody": "x"},
             {"Authorization": "Bearer x"})  # no SigV4 signature: none either
    got = await ok(api, "ReceiveMessage", {"QueueUrl": url, "AttributeNames": ["All"]})
    assert "SenderId" not in got["Messages"][0]["Attributes"]
    await ok(api, "DeleteMessage", {"QueueUrl": url,
                                    "ReceiptHandle": got["Messages"][0]["ReceiptHandle"]})
    body = {"QueueUrl": url, "Entries": [{"Id": "a", "MessageBody": "1"}]}
    await ok(api, "SendMessageBatch", body, signed(api, "SendMessageBatch", body, "AKIDBATCH"))
    got = await ok(api, "ReceiveMessage", {"QueueUrl": url, "AttributeNames": ["SenderId"]})
    assert got["Messages"][0]["Attributes"] == {"SenderId": "AKIDBATCH"}


@pytest.fixture
async def signed_api(tmp_path):
    async for client in signed_app(tmp_path, [{"id": "AKIDADMIN", "secret": "s", "name": "ops",
                                          "scopes": {"admin": [""], "read": [""],
                                                     "write": [""]}}]):
        yield client


async def test_with_auth_on_the_sender_id_is_the_verified_key_id(signed_api):
    api = signed_api
    body = {"QueueName": "verified"}
    url = (await ok(api, "CreateQueue", body, signed(api, "CreateQueue", body, "AKIDADMIN"))
           )["QueueUrl"]
    assert await sent_by(api, url, "AKIDADMIN", "AKIDADMIN") == "AKIDADMIN"


async def test_the_first_receive_timestamp_stays_through_later_receives(api):
    url = await make(api, "firsts")
    await ok(api, "SendMessage", {"QueueUrl": url, "MessageBody": "x"})
    before = int(time.time() * 1000)
    times = []
    for count in ("1", "2"):
        got = await ok(api, "ReceiveMessage", {"QueueUrl": url, "AttributeNames": [
            "ApproximateFirstReceiveTimestamp", "ApproximateReceiveCount"]})
        [m] = got["Messages"]
        assert m["Attributes"]["ApproximateReceiveCount"] == count
        times.append(int(m["Attributes"]["ApproximateFirstReceiveTimestamp"]))
        await ok(api, "ChangeMessageVisibility", {"QueueUrl": url, "VisibilityTimeout": 0,
                                                  "ReceiptHandle": m["ReceiptHandle"]})
        await asyncio.sleep(0.01)
    assert before <= times[0] == times[1] <= int(time.time() * 1000)
    got = await ok(api, "ReceiveMessage", {"QueueUrl": url,
                                           "MessageSystemAttributeNames": ["SentTimestamp"]})
    assert list(got["Messages"][0]["Attributes"]) == ["SentTimestamp"]


async def fifo(api, name, *groups):
    """A FIFO queue with one message per group given ("a1" in group "a", ...)."""
    url = await make(api, name + ".fifo", FifoQueue="true", ContentBasedDeduplication="true")
    for body in groups:
        await ok(api, "SendMessage", {"QueueUrl": url, "MessageBody": body,
                                      "MessageGroupId": body[0]})
    return url


async def receive(api, url, attempt_id=None, **more):
    body = {"QueueUrl": url, "MaxNumberOfMessages": 10, "AttributeNames": ["All"], **more}
    if attempt_id is not None:
        body["ReceiveRequestAttemptId"] = attempt_id
    return (await ok(api, "ReceiveMessage", body)).get("Messages", [])


def seen(messages):
    return [(m["Body"], m["ReceiptHandle"], m["Attributes"]["ApproximateReceiveCount"])
            for m in messages]


async def test_a_receive_retried_with_its_attempt_id_answers_the_same_messages(api):
    url = await fifo(api, "attempts", "a1", "b1", "a2")
    first = await receive(api, url, "try-1", VisibilityTimeout=30)
    assert [m["Body"] for m in first] == ["a1", "b1"]
    work = api.server.app[WORK]
    handles = [decode_handle(m["ReceiptHandle"]) for m in first]
    tokens = [h[1] for h in handles if h is not None]
    deadlines = work.lease_deadlines(url.rsplit("/", 1)[1], "sqs", tokens)
    await asyncio.sleep(0.01)
    again = await receive(api, url, "try-1", VisibilityTimeout=30)
    assert seen(again) == seen(first)  # the same handles, not received once more
    later = work.lease_deadlines(url.rsplit("/", 1)[1], "sqs", tokens)
    assert all(b > a for a, b in zip(deadlines, later, strict=True))  # visibility reset
    assert await receive(api, url, "try-2") == []  # a2 waits for a1
    assert await receive(api, url) == []
    assert seen(await receive(api, url, "try-1")) == seen(first)
    await ok(api, "DeleteMessage", {"QueueUrl": url, "ReceiptHandle": first[0]["ReceiptHandle"]})
    # a1 was deleted: the id answers no more what it answered; the call receives anew
    assert [m["Body"] for m in await receive(api, url, "try-1")] == ["a2"]


async def test_an_attempt_id_whose_messages_changed_or_expired_receives_anew(api):
    url = await fifo(api, "changed", "a1")
    [m] = await receive(api, url, "c")
    await ok(api, "ChangeMessageVisibility", {"QueueUrl": url, "VisibilityTimeout": 60,
                                              "ReceiptHandle": m["ReceiptHandle"]})
    assert await receive(api, url, "c") == []  # its visibility changed: a1 stays invisible
    url = await fifo(api, "expired", "b1")
    [m] = await receive(api, url, "e", VisibilityTimeout=0)  # the shortest lease, 100 ms
    await asyncio.sleep(0.2)
    [again] = await receive(api, url, "e")  # its visibility ran out: received again
    assert again["Body"] == "b1" and again["ReceiptHandle"] != m["ReceiptHandle"]
    assert again["Attributes"]["ApproximateReceiveCount"] == "2"
    assert seen(await receive(api, url, "e")) == seen([again])  # kept under the id now
    url = await fifo(api, "empty")
    assert await receive(api, url, "n") == []  # an empty answer is not kept
    await ok(api, "SendMessage", {"QueueUrl": url, "MessageBody": "z1", "MessageGroupId": "z"})
    assert [m["Body"] for m in await receive(api, url, "n")] == ["z1"]


async def test_a_standard_queue_ignores_the_attempt_id(api):
    url = await make(api, "standard")
    for body in ("m1", "m2"):
        await ok(api, "SendMessage", {"QueueUrl": url, "MessageBody": body})
    first = await receive(api, url, "same", MaxNumberOfMessages=1)
    again = await receive(api, url, "same", MaxNumberOfMessages=1)
    assert [m["Body"] for m in first + again] == ["m1", "m2"]
    assert await receive(api, url, "not valid here: ignored") == []


@pytest.mark.parametrize("attempt_id", ["", "x" * 129, "with space", "é", 5, ["a"]])
async def test_a_bad_attempt_id_is_refused_on_a_fifo_queue(api, attempt_id):
    url = await fifo(api, "bad", "a1")
    status, _, headers = await call(api, "ReceiveMessage", {
        "QueueUrl": url, "ReceiveRequestAttemptId": attempt_id})
    assert status == 400 and headers["x-amzn-query-error"] == "InvalidParameterValue;Sender"
    assert [m["Body"] for m in await receive(api, url, "!~" + "x" * 126)] == ["a1"]


def test_attempt_ids_are_kept_five_minutes_and_the_oldest_go_past_the_bound():
    kept = ReceiveAttempts(limit=2)
    answer = [Answered(1, "1.1.1", 1, 10_000, 5)]
    kept.keep("q", "a", Attempt(1_000, answer))
    assert kept.get("q", "a", 1_000 + WINDOW_MS - 1) is not None
    assert kept.get("q", "a", 1_000 + WINDOW_MS) is None
    for i, attempt_id in enumerate(("b", "c", "d")):
        kept.keep("q", attempt_id, Attempt(2_000 + i, answer))
    assert len(kept) == 2 and kept.get("q", "b", 3_000) is None
    assert kept.get("q", "d", 3_000) is not None and kept.get("other", "d", 3_000) is None
    kept.keep("q", "d", Attempt(3_000, []))  # an empty answer replaces none
    assert kept.get("q", "d", 3_000) is None
