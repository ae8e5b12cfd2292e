"""What SQS answers beside a message, through the node's HTTP app over an in-memory node: the
AWSTraceHeader system attribute (sent, digested, received), SenderId,
ApproximateFirstReceiveTimestamp and ReceiveRequestAttemptId (docs/sqs.md)."""

import asyncio
import hashlib
import json
import os
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.unit.nodes import queue_service
from vqueues.api.app import create_app
from vqueues.settings import Settings

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
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": []}))
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"id": "AKIDADMIN", "secret": "s", "name": "ops",
                                          "scopes": {"admin": [""], "read": [""],
                                                     "write": [""]}}]}))
    os.chmod(keys, 0o600)
    settings = Settings(write_visible_timeout_ms=1000, auth=True, auth_token_file=str(tokens),
                        sqs_access_key_file=str(keys))
    svc = await queue_service(settings)
    server = TestServer(create_app(svc, settings))
    await server.start_server(auto_decompress=False, access_log=None)
    async with TestClient(server) as client:
        yield client
    svc.close()


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
