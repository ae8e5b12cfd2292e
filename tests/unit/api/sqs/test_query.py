"""The query protocol's translation (vqueues/api/sqs/query.py) against botocore's own query
serializer and parser over SQS's last query-protocol model (botocore 1.34.22's, without its
documentation, in tests/data/botocore_sqs_query): every member of every action vqueues does
decodes to the JSON input, and every output member encodes to XML the SDK parses back."""

import base64
import json
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode

import botocore.session
import pytest
from botocore import parsers, serialize
from botocore.model import ServiceModel

from vqueues.api.sqs import actions
from vqueues.api.sqs.protocol import SqsError, xml_error
from vqueues.api.sqs.query import ACTIONS, ListOf, MapOf, Struct, decode, encode

pytestmark = pytest.mark.unit
MODEL_PATH = Path(__file__).parents[3] / "data/botocore_sqs_query/sqs/2012-11-05/service-2.json"
QUERY_MODEL = ServiceModel(json.loads(MODEL_PATH.read_text()), "sqs")
TEXT = "a & <b> \"c\" 'd'\r\ne\rf é 😀"


def sample(shape, name):
    """A value for every member of `shape`, lists and maps of two."""
    kind = shape.type_name
    if kind == "structure":
        return {n: sample(s, n) for n, s in shape.members.items()}
    if kind == "list":
        return [sample(shape.member, f"{name}{i}") for i in (1, 2)]
    if kind == "map":
        keys = shape.key.enum[:2] if shape.key.enum else [f"{name}-k{i}" for i in (1, 2)]
        return {k: sample(shape.value, f"{name}{k}") for k in keys}
    if kind == "integer":
        return 7
    if kind == "boolean":
        return True
    if kind == "blob":
        return b"\x00\xff\r" + name.encode()
    return shape.enum[0] if shape.enum else f"{name} {TEXT}"


def as_json(value):
    """A botocore value as JSON 1.0 carries it (blobs in base64)."""
    if isinstance(value, dict):
        return {k: as_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_json(v) for v in value]
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def parse(xml, shape, status=200):
    """An answer as botocore's query parser reads it (`shape` None: an error)."""
    parser: Any = parsers.QueryParser()
    return parser.parse({"body": xml, "headers": {}, "status_code": status}, shape)


def output_shape(action) -> Any:
    return QUERY_MODEL.operation_model(action).output_shape


def form(action, params):
    """The form body botocore's query serializer makes, as a node parses it."""
    body = serialize.create_serializer("query").serialize_to_request(
        params, QUERY_MODEL.operation_model(action))["body"]
    return parse_qsl(urlencode(body), keep_blank_values=True)


def test_the_table_has_the_json_actions_and_their_result_wrappers():
    assert set(ACTIONS) == set(actions.ACTIONS)
    for action, (_, output) in ACTIONS.items():
        shape = output_shape(action)
        assert (output is None) == (shape is None)
        if output is not None:
            assert shape.serialization["resultWrapper"] == f"{action}Result"


def _json_names(shape, seen=()):
    """Every JSON member path of a table shape, or of a botocore shape."""
    if isinstance(shape, Struct) or getattr(shape, "type_name", None) == "structure":
        members = ([(m.name, m.shape) for m in shape.members] if isinstance(shape, Struct)
                   else list(shape.members.items()))
        return {f"{n}.{p}" if p else n for n, s in members for p in (_json_names(s) or {""})}
    if isinstance(shape, ListOf) or getattr(shape, "type_name", None) == "list":
        return _json_names(shape.item if isinstance(shape, ListOf) else shape.member)
    if isinstance(shape, MapOf) or getattr(shape, "type_name", None) == "map":
        return _json_names(shape.item if isinstance(shape, MapOf) else shape.value)
    return set()


def test_the_table_has_every_member_of_the_current_json_model():
    current = botocore.session.get_session().get_service_model("sqs")
    assert current.protocol == "json"
    for action, (given, answered) in ACTIONS.items():
        op = current.operation_model(action)
        assert _json_names(given) == _json_names(op.input_shape), action
        assert _json_names(answered) == _json_names(op.output_shape), action


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_every_input_member_decodes_as_json_gives_it(action):
    params = sample(QUERY_MODEL.operation_model(action).input_shape, action)
    name, body = decode(form(action, params))
    assert name == action
    assert body == as_json(params)


@pytest.mark.parametrize("action", sorted(a for a, (_, out) in ACTIONS.items() if out))
def test_every_output_member_encodes_as_the_sdk_parses_it(action):
    shape = output_shape(action)
    output = sample(shape, action)
    xml = encode(action, as_json(output), "req-1")
    parsed = parse(xml.encode(), shape)
    assert parsed.pop("ResponseMetadata")["RequestId"] == "req-1"
    assert parsed == output


def test_an_action_without_output_answers_its_request_id():
    xml = encode("DeleteQueue", {}, "req-2")
    assert xml == ('<?xml version="1.0"?><DeleteQueueResponse xmlns="http://queue.amazonaws.com'
                   '/doc/2012-11-05/"><ResponseMetadata><RequestId>req-2</RequestId>'
                   "</ResponseMetadata></DeleteQueueResponse>")


def test_an_empty_answer_has_an_empty_result():
    xml = encode("ReceiveMessage", {"Messages": []}, "r")
    assert "<ReceiveMessageResult></ReceiveMessageResult>" in xml
    parsed = parse(xml.encode(), output_shape("ReceiveMessage"))
    assert "Messages" not in parsed


def test_text_xml_cannot_carry_becomes_the_replacement_character():
    xml = encode("ReceiveMessage", {"Messages": [{"Body": "a\x00b\x1bc\ufffe"}]}, "r")
    assert "<Body>a\ufffdb\ufffdc\ufffd</Body>" in xml


def test_an_error_is_the_query_protocols_error_botocore_parses():
    response = xml_error(SqsError("QueueDoesNotExist", "no <such> queue\r"), "req-3")
    parsed = parse(response.body, None, 400)
    assert parsed["Error"] == {"Type": "Sender", "Code": "AWS.SimpleQueueService.NonExistentQueue",
                               "Message": "no <such> queue\r", "Detail": None}


@pytest.mark.parametrize(("params", "expected"), [
    # the names of the model after the query protocol's (MessageSystemAttributeNames)
    ("Action=ReceiveMessage&QueueUrl=u&MessageSystemAttributeName.1=All"
     "&MessageSystemAttributeName.2=SenderId",
     {"QueueUrl": "u", "MessageSystemAttributeNames": ["All", "SenderId"]}),
    # integers where JSON has integers; text that is none stays text (the action refuses it)
    ("Action=ReceiveMessage&QueueUrl=u&MaxNumberOfMessages=10&WaitTimeSeconds=-1"
     "&VisibilityTimeout=x1",
     {"QueueUrl": "u", "MaxNumberOfMessages": 10, "WaitTimeSeconds": -1,
      "VisibilityTimeout": "x1"}),
    ("Action=ListQueues&MaxResults=2&QueueNamePrefix=07", {"MaxResults": 2,
                                                           "QueueNamePrefix": "07"}),
    # items in their indices' order, gaps and all; unknown parameters are ignored
    ("Action=GetQueueAttributes&QueueUrl=u&AttributeName.10=B&AttributeName.2=A"
     "&AttributeName.x=C&Version=2012-11-05&Other=1",
     {"QueueUrl": "u", "AttributeNames": ["A", "B"]}),
    # an empty list as botocore sends one, and none
    ("Action=DeleteMessageBatch&QueueUrl=u&Entries=", {"QueueUrl": "u", "Entries": []}),
    ("Action=DeleteMessageBatch&QueueUrl=u", {"QueueUrl": "u"}),
    # an empty value is a value (RedrivePolicy "" removes a redrive policy)
    ("Action=SetQueueAttributes&QueueUrl=u&Attribute.1.Name=RedrivePolicy&Attribute.1.Value=",
     {"QueueUrl": "u", "Attributes": {"RedrivePolicy": ""}}),
    ("Action=SetQueueAttributes&QueueUrl=u&Attribute.1.Name=DelaySeconds",
     {"QueueUrl": "u", "Attributes": {"DelaySeconds": None}}),
    ("Action=TagQueue&QueueUrl=u", {}),  # an action the table lacks: the route refuses it
])
def test_a_form_decodes_to_the_json_input(params, expected):
    name, body = decode(parse_qsl(params, keep_blank_values=True))
    assert name == params.split("&")[0].split("=")[1]
    assert body == expected


@pytest.mark.parametrize(("params", "code"), [
    ("QueueUrl=u", "InvalidAction"),
    ("Action=&QueueUrl=u", "InvalidAction"),
    ("Action=DeleteQueue&QueueUrl=u&QueueUrl=v", "InvalidParameterValue"),
    ("Action=SetQueueAttributes&QueueUrl=u&Attribute.1.Value=1", "MissingParameter"),
    ("Action=SetQueueAttributes&QueueUrl=u&Attribute.1.Name=A&Attribute.1.Value=1"
     "&Attribute.2.Name=A&Attribute.2.Value=2", "InvalidParameterValue"),
])
def test_a_form_that_cannot_be_decoded_is_refused(params, code):
    with pytest.raises(SqsError) as info:
        decode(parse_qsl(params, keep_blank_values=True))
    assert info.value.name == code
