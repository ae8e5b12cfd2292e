"""The SQS route through the node's HTTP app over an in-memory node: its requests pass the
native routes' middlewares (content type, body, Bearer auth) untouched, and every refusal is
in SQS's shape (JSON 1.0 with x-amzn-query-error, or the query protocol's XML)."""

import hashlib
import json
from urllib.parse import quote, urlencode
from xml.etree import ElementTree

import pytest
from aiohttp.test_utils import TestClient, TestServer
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.unit.api.sqs.signed import signed_app
from tests.unit.nodes import queue_service
from vqueues.api.app import create_app
from vqueues.api.sqs.route import MAX_QUERY_PARAMETERS
from vqueues.settings import Settings

pytestmark = pytest.mark.unit
JSON = "application/x-amz-json-1.0"
NS = "{http://queue.amazonaws.com/doc/2012-11-05/}"


async def call(api, action, body, path="/", content_type=JSON):
    resp = await api.post(path, data=json.dumps(body) if isinstance(body, dict) else body,
                          headers={"Content-Type": content_type,
                                   "X-Amz-Target": f"AmazonSQS.{action}"})
    return resp.status, await resp.read(), resp.headers


async def test_a_queue_is_made_used_and_found_through_either_path(api):
    status, raw, headers = await call(api, "CreateQueue", {"QueueName": "jobs"})
    assert status == 200 and headers["Content-Type"] == JSON
    url = json.loads(raw)["QueueUrl"]
    assert url.endswith("/000000000000/jobs")
    status, raw, _ = await call(api, "SendMessage", {"QueueUrl": url, "MessageBody": "hi"},
                                path="/000000000000/jobs")
    assert status == 200 and json.loads(raw)["MD5OfMessageBody"] == \
        "49f68a5c8493ec2c0bf489821c21fc3b"
    status, raw, _ = await call(api, "ReceiveMessage", {"QueueUrl": url})
    assert [m["Body"] for m in json.loads(raw)["Messages"]] == ["hi"]


@pytest.mark.parametrize(("action", "body", "status", "name", "code"), [
    ("GetQueueUrl", {"QueueName": "missing"}, 400, "QueueDoesNotExist",
     "AWS.SimpleQueueService.NonExistentQueue"),
    ("SendMessage", {"QueueUrl": "http://h/000000000000/missing", "MessageBody": "x"}, 400,
     "QueueDoesNotExist", "AWS.SimpleQueueService.NonExistentQueue"),
    ("SendMessage", {"MessageBody": "x"}, 400, "MissingParameter", "MissingParameter"),
    ("Frobnicate", {}, 400, "InvalidAction", "InvalidAction"),
    ("TagQueue", {}, 400, "UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation"),
    ("AddPermission", {}, 400, "UnsupportedOperation",
     "AWS.SimpleQueueService.UnsupportedOperation"),
    ("CreateQueue", {"QueueName": "no.dots"}, 400, "InvalidParameterValue",
     "InvalidParameterValue"),
    ("CreateQueue", {"QueueName": "x", "Attributes": {"Policy": "{}"}}, 400,
     "UnsupportedOperation", "AWS.SimpleQueueService.UnsupportedOperation"),
    ("CreateQueue", {"QueueName": "x", "Attributes": {"Nope": "1"}}, 400,
     "InvalidAttributeName", "InvalidAttributeName"),
    ("CreateQueue", {"QueueName": "x", "Attributes": {"DelaySeconds": "901"}}, 400,
     "InvalidAttributeValue", "InvalidAttributeValue"),
    ("CreateQueue", {"QueueName": "x.fifo"}, 400, "InvalidParameterValue",
     "InvalidParameterValue"),
    ("CreateQueue", "[1, 2]", 400, "InvalidParameterValue", "InvalidParameterValue"),
    ("CreateQueue", "{not json", 400, "InvalidParameterValue", "InvalidParameterValue"),
])
async def test_refusals_are_in_sqs_shapes(api, action, body, status, name, code):
    got, raw, headers = await call(api, action, body)
    assert got == status
    assert json.loads(raw)["__type"] == f"com.amazonaws.sqs#{name}"
    assert headers["x-amzn-query-error"] == f"{code};Sender"


async def test_a_receipt_handle_of_another_queue_is_invalid(api):
    urls = [json.loads((await call(api, "CreateQueue", {"QueueName": q}))[1])["QueueUrl"]
            for q in ("one", "two")]
    await call(api, "SendMessage", {"QueueUrl": urls[0], "MessageBody": "x"})
    _, raw, _ = await call(api, "ReceiveMessage", {"QueueUrl": urls[0]})
    handle = json.loads(raw)["Messages"][0]["ReceiptHandle"]
    status, raw, headers = await call(api, "DeleteMessage", {"QueueUrl": urls[1],
                                                             "ReceiptHandle": handle})
    assert status == 404 and headers["x-amzn-query-error"] == "ReceiptHandleIsInvalid;Sender"


async def query_call(api, params, path="/", method="POST"):
    """A query-protocol call: (status, the XML answer's root, headers)."""
    if method == "GET":
        resp = await api.get(path + "?" + urlencode(params))
    else:
        resp = await api.post(path, data=urlencode(params), headers={
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    assert resp.content_type == "text/xml"
    return resp.status, ElementTree.fromstring(await resp.read()), resp.headers


def text_of(root, name):
    return [e.text for e in root.iter(f"{NS}{name}")]


async def test_a_query_call_is_answered_in_xml_through_either_path_and_get(api):
    status, root, headers = await query_call(api, {
        "Action": "CreateQueue", "QueueName": "jobs", "Attribute.1.Name": "DelaySeconds",
        "Attribute.1.Value": "0", "Version": "2012-11-05"})
    assert status == 200 and root.tag == f"{NS}CreateQueueResponse"
    [url] = text_of(root, "QueueUrl")
    assert url.endswith("/000000000000/jobs")
    assert text_of(root, "RequestId") == [headers["x-amzn-RequestId"]]
    status, root, _ = await query_call(api, {
        "Action": "SendMessage", "QueueUrl": url, "MessageBody": "hi\r\n<&>",
        "MessageAttribute.1.Name": "n", "MessageAttribute.1.Value.DataType": "Number",
        "MessageAttribute.1.Value.StringValue": "5"}, path="/000000000000/jobs")
    assert status == 200 and text_of(root, "MD5OfMessageBody") == [
        hashlib.md5(b"hi\r\n<&>").hexdigest()]
    status, root, _ = await query_call(api, {
        "Action": "ReceiveMessage", "QueueUrl": url, "MessageAttributeName.1": "All",
        "AttributeName.1": "ApproximateReceiveCount"}, method="GET")
    assert status == 200 and text_of(root, "Body") == ["hi\r\n<&>"]
    [attribute] = [e for e in root.iter(f"{NS}Attribute")]
    assert [c.text for c in attribute] == ["ApproximateReceiveCount", "1"]
    assert text_of(root, "StringValue") == ["5"] and text_of(root, "DataType") == ["Number"]


@pytest.mark.parametrize(("params", "status", "code"), [
    ({"Action": "Frobnicate"}, 400, "InvalidAction"),
    ({"QueueName": "x"}, 400, "InvalidAction"),
    ({"Action": "TagQueue"}, 400, "AWS.SimpleQueueService.UnsupportedOperation"),
    ({"Action": "GetQueueUrl", "QueueName": "missing"}, 400,
     "AWS.SimpleQueueService.NonExistentQueue"),
    ({"Action": "ReceiveMessage", "QueueUrl": "http://h/000000000000/x",
      "MaxNumberOfMessages": "ten"}, 400, "AWS.SimpleQueueService.NonExistentQueue"),
    ({"Action": "ListQueues", "MaxResults": "ten"}, 400, "InvalidParameterValue"),
    ({"Action": "DeleteMessageBatch", "QueueUrl": "http://h/000000000000/x",
      "Entries": ""}, 400, "AWS.SimpleQueueService.NonExistentQueue"),
])
async def test_a_query_refusal_is_the_query_protocols_xml_error(api, params, status, code):
    got, root, _ = await query_call(api, params, path="/000000000000/q")
    assert got == status and root.tag == f"{NS}ErrorResponse"
    assert text_of(root, "Code") == [code] and text_of(root, "Type") == ["Sender"]


async def test_a_batch_without_entries_is_missing_them_and_an_empty_one_is_empty(api):
    _, root, _ = await query_call(api, {"Action": "CreateQueue", "QueueName": "b"})
    [url] = text_of(root, "QueueUrl")
    for params, code in (({}, "MissingParameter"),
                         ({"Entries": ""}, "AWS.SimpleQueueService.EmptyBatchRequest")):
        status, root, _ = await query_call(api, {"Action": "SendMessageBatch", "QueueUrl": url,
                                                 **params})
        assert status == 400 and text_of(root, "Code") == [code]


async def test_a_post_takes_the_parameters_of_its_query_string_and_its_body(api):
    resp = await api.post("/?Action=CreateQueue", data="QueueName=both", headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status == 200 and "/000000000000/both</QueueUrl>" in await resp.text()
    resp = await api.post("/?QueueName=x", data="Action=CreateQueue&QueueName=both", headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status == 400 and "<Code>InvalidParameterValue</Code>" in await resp.text()


async def test_a_form_that_is_not_utf_8_is_refused(api):
    resp = await api.post("/", data=b"Action=ListQueues&QueueNamePrefix=%ff", headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    assert resp.status == 400 and "<Code>InvalidParameterValue</Code>" in await resp.text()


async def test_a_query_string_that_is_not_utf_8_is_refused_in_xml(api):
    resp = await api.get("/?Action=ListQueues&QueueNamePrefix=%ff")
    assert resp.status == 400 and "<Code>InvalidParameterValue</Code>" in await resp.text()


async def test_a_query_call_of_too_many_parameters_is_refused_before_it_is_parsed(api):
    body = "Action=ListQueues&" + "&".join(f"a.{i}=" for i in range(MAX_QUERY_PARAMETERS))
    resp = await api.post("/", data=body.encode(), headers={
        "Content-Type": "application/x-www-form-urlencoded"})
    text = await resp.text()
    assert resp.status == 400 and "<Code>InvalidParameterValue</Code>" in text, text
    assert f"at most {MAX_QUERY_PARAMETERS} parameters" in text


async def test_a_json_body_nested_past_the_parsers_depth_is_not_json(api):
    resp = await api.post("/", data=b"[" * 100_000, headers={
        "Content-Type": "application/x-amz-json-1.0", "X-Amz-Target": "AmazonSQS.ListQueues"})
    assert resp.status == 400
    assert resp.headers["x-amzn-query-error"].startswith("InvalidParameterValue;")


async def test_a_post_without_the_target_is_an_invalid_action(api):
    resp = await api.post("/", data="{}", headers={"Content-Type": "application/json"})
    assert resp.status == 400
    assert resp.headers["x-amzn-query-error"] == "InvalidAction;Sender"


@pytest.fixture
async def auth_api(tmp_path):
    async for client in signed_app(tmp_path, None):
        yield client


async def test_with_auth_on_and_no_access_keys_the_route_answers_access_denied(auth_api):
    status, raw, headers = await call(auth_api, "ListQueues", {})
    assert status == 403 and json.loads(raw)["__type"] == "com.amazonaws.sqs#AccessDenied"
    assert headers["x-amzn-query-error"] == "AccessDenied;Sender"
    # the native routes still want their Bearer token
    resp = await auth_api.get("/v1/queues")
    assert resp.status == 401


async def test_sends_are_charged_to_the_enqueue_quota(tmp_path):
    quotas = tmp_path / "quotas.json"
    quotas.write_text(json.dumps({"quotas": [{"prefix": "", "records_per_s": 1}]}))
    settings = Settings(write_visible_timeout_ms=1000, quota_file=str(quotas))
    svc = await queue_service(settings)
    server = TestServer(create_app(svc, settings))
    await server.start_server(auto_decompress=False, access_log=None)
    async with TestClient(server) as api:
        _, raw, _ = await call(api, "CreateQueue", {"QueueName": "limited"})
        url = json.loads(raw)["QueueUrl"]
        status, _, _ = await call(api, "SendMessage", {"QueueUrl": url, "MessageBody": "1"})
        assert status == 200
        status, raw, headers = await call(api, "SendMessage", {"QueueUrl": url,
                                                               "MessageBody": "2"})
        assert status == 403 and headers["x-amzn-query-error"] == "RequestThrottled;Sender"
    svc.close()


@pytest.fixture
async def signed_api(tmp_path):
    async for client in signed_app(tmp_path, [
        {"id": "ADMIN", "secret": "a", "name": "ops", "scopes": {"admin": [""], "read": [""],
                                                                  "write": [""]}},
        {"id": "READER", "secret": "r", "name": "reader", "scopes": {"read": ["jobs"]}}]):
        yield client


async def signed_call(api, action, body, key, secret):
    url = str(api.make_url("/"))
    request = AWSRequest("POST", url, data=json.dumps(body).encode(), headers={
        "Content-Type": JSON, "X-Amz-Target": f"AmazonSQS.{action}"})
    SigV4Auth(Credentials(key, secret), "sqs", "us-east-1").add_auth(request)
    resp = await api.post("/", data=request.body, headers=dict(request.headers))
    return resp.status, await resp.read(), resp.headers


async def test_signed_calls_are_taken_within_their_keys_scopes(signed_api):
    status, raw, _ = await signed_call(signed_api, "CreateQueue", {"QueueName": "jobs"},
                                       "ADMIN", "a")
    assert status == 200
    url = json.loads(raw)["QueueUrl"]
    status, _, _ = await signed_call(signed_api, "ReceiveMessage", {"QueueUrl": url},
                                     "READER", "r")
    assert status == 200
    for action, body in (("SendMessage", {"QueueUrl": url, "MessageBody": "x"}),
                         ("ListQueues", {}), ("DeleteQueue", {"QueueUrl": url})):
        status, raw, headers = await signed_call(signed_api, action, body, "READER", "r")
        assert status == 403 and headers["x-amzn-query-error"] == "AccessDenied;Sender"
    status, _, headers = await signed_call(signed_api, "ListQueues", {}, "READER", "wrong")
    assert status == 403 and headers["x-amzn-query-error"] == "SignatureDoesNotMatch;Sender"
    status, _, headers = await signed_call(signed_api, "ListQueues", {}, "NOBODY", "x")
    assert status == 403 and headers["x-amzn-query-error"] == "InvalidClientTokenId;Sender"
    status, _, headers = await call(signed_api, "ListQueues", {})  # unsigned
    assert status == 403 and headers["x-amzn-query-error"] == "MissingAuthenticationToken;Sender"


@pytest.mark.parametrize("body", [{"MaxResults": 0}, {"MaxResults": 1001},
                                  {"MaxResults": "5"}, {"NextToken": "***"}])
async def test_a_bad_page_of_list_queues_is_refused(api, body):
    status, _, headers = await call(api, "ListQueues", body)
    assert status == 400 and headers["x-amzn-query-error"] == "InvalidParameterValue;Sender"


async def signed_query(api, params, key, secret, method="POST", tamper=False):
    """A query-protocol call signed as botocore signs one: a form body, or a GET's query."""
    query = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}"
                     for k, v in params.items())
    if method == "GET":
        request = AWSRequest("GET", str(api.make_url("/")) + "?" + query)
    else:
        request = AWSRequest("POST", str(api.make_url("/")), data=query.encode(), headers={
            "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"})
    SigV4Auth(Credentials(key, secret), "sqs", "us-east-1").add_auth(request)
    body = query.encode()  # what was signed
    if tamper:  # a parameter added after signing
        if method == "GET":
            query += "&MaxResults=1"
        else:
            body += b"&MaxResults=1"
    if method == "GET":
        resp = await api.get("/?" + query, headers=dict(request.headers))
    else:
        resp = await api.post("/", data=body, headers=dict(request.headers))
    return resp.status, ElementTree.fromstring(await resp.read())


@pytest.mark.parametrize("method", ["POST", "GET"])
async def test_signed_query_calls_are_verified_over_their_parameters(signed_api, method):
    params = {"Action": "CreateQueue", "QueueName": "jobs", "Attribute.1.Name": "DelaySeconds",
              "Attribute.1.Value": "0", "Version": "2012-11-05"}
    status, root = await signed_query(signed_api, params, "ADMIN", "a", method)
    assert status == 200 and text_of(root, "QueueUrl")[0].endswith("/jobs")
    listing = {"Action": "ListQueues", "QueueNamePrefix": "jo b+&=/ü"}
    status, root = await signed_query(signed_api, listing, "ADMIN", "a", method)
    assert status == 200 and root.tag == f"{NS}ListQueuesResponse"
    status, root = await signed_query(signed_api, listing, "ADMIN", "a", method, tamper=True)
    assert status == 403 and text_of(root, "Code") == ["SignatureDoesNotMatch"]
    status, root = await signed_query(signed_api, params, "READER", "r", method)
    assert status == 403 and text_of(root, "Code") == ["AccessDenied"]
    status, root, _ = await query_call(signed_api, listing, method=method)  # unsigned
    assert status == 403 and text_of(root, "Code") == ["MissingAuthenticationToken"]
