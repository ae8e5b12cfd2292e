"""Queue attributes: which are taken, in what ranges, and how a RedrivePolicy reads."""

import json

import pytest

from vqueues.api.sqs.attributes import NO_REDRIVE, check_queue_name, parse_changes
from vqueues.api.sqs.protocol import SqsError

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["a", "A-b_9", "x" * 80, "x" * 75 + ".fifo"])
def test_sqs_names_are_taken(name):
    assert check_queue_name(name) == name


@pytest.mark.parametrize("name", ["", "x" * 81, "x" * 76 + ".fifo", "a.b", "a/b", "é", None,
                                  ".fifo"])
def test_other_names_are_refused(name):
    with pytest.raises(SqsError) as info:
        check_queue_name(name)
    assert info.value.name == "InvalidParameterValue"


def test_a_redrive_policy_names_its_queue_by_the_arns_last_part():
    policy = json.dumps({"deadLetterTargetArn": "arn:aws:sqs:eu-west-1:123456789012:dead",
                         "maxReceiveCount": "3"})
    assert parse_changes({"RedrivePolicy": policy}, "q", False).redrive == ("dead", 3)
    assert parse_changes({"RedrivePolicy": ""}, "q", False).redrive == NO_REDRIVE


@pytest.mark.parametrize(("given", "name"), [
    ({"RedrivePolicy": "{"}, "InvalidAttributeValue"),
    ({"RedrivePolicy": json.dumps({"deadLetterTargetArn": "dead", "maxReceiveCount": 1})},
     "InvalidAttributeValue"),
    ({"RedrivePolicy": json.dumps({"deadLetterTargetArn": "arn:aws:sqs:r:1:d.fifo",
                                   "maxReceiveCount": 1})}, "InvalidParameterValue"),
    ({"RedrivePolicy": json.dumps({"deadLetterTargetArn": "arn:aws:sqs:r:1:d",
                                   "maxReceiveCount": 1001})}, "InvalidAttributeValue"),
    ({"VisibilityTimeout": "43201"}, "InvalidAttributeValue"),
    ({"VisibilityTimeout": "-1"}, "InvalidAttributeValue"),
    ({"MaximumMessageSize": "1023"}, "InvalidAttributeValue"),
    ({"ReceiveMessageWaitTimeSeconds": "21"}, "InvalidAttributeValue"),
    ({"ContentBasedDeduplication": "true"}, "InvalidAttributeName"),  # not a FIFO queue
    ({"FifoQueue": "true"}, "InvalidAttributeName"),  # set at creation only
    ({"KmsMasterKeyId": "k"}, "UnsupportedOperation"),
    ({"DelaySeconds": 5}, "InvalidParameterValue"),  # values are strings
])
def test_bad_attributes_are_refused_with_sqs_codes(given, name):
    with pytest.raises(SqsError) as info:
        parse_changes(given, "q", False)
    assert info.value.name == name
