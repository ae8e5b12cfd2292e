"""Queue names and queue attributes: which attributes map onto the `sqs` consumer's settings
(VisibilityTimeout, RedrivePolicy), which are kept beside them in its attributes (the rest of
what CreateQueue and SetQueueAttributes take), and which are counted when asked
(docs/sqs.md)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from vqueues.api.sqs.protocol import SqsError

SQS_CONSUMER = "sqs"
NAME = re.compile(r"[A-Za-z0-9_-]{1,80}")
MAX_NAME_CHARS = 80
FIFO_SUFFIX = ".fifo"
# A queue without a RedrivePolicy: deliveries before the record is given up (the most a
# consumer's max_attempts may be).
NO_REDRIVE_ATTEMPTS = 1000
MAX_RECEIVE_COUNT = 1000

# Kept in the consumer's attributes: name -> (lowest, highest) for numbers, or the values taken.
NUMBERS = {"DelaySeconds": (0, 900), "MaximumMessageSize": (1024, 1_048_576),
           "MessageRetentionPeriod": (60, 1_209_600), "ReceiveMessageWaitTimeSeconds": (0, 20)}
CHOICES = {"ContentBasedDeduplication": ("true", "false"),
           "DeduplicationScope": ("messageGroup", "queue"),
           "FifoThroughputLimit": ("perQueue", "perMessageGroupId"),
           "SqsManagedSseEnabled": ("true", "false")}
FIFO_ONLY = ("ContentBasedDeduplication", "DeduplicationScope", "FifoThroughputLimit")
DEFAULTS = {"DelaySeconds": "0", "MaximumMessageSize": "262144",
            "MessageRetentionPeriod": "345600", "ReceiveMessageWaitTimeSeconds": "0",
            "SqsManagedSseEnabled": "false"}
FIFO_DEFAULTS = {"FifoQueue": "true", "ContentBasedDeduplication": "false",
                 "DeduplicationScope": "queue", "FifoThroughputLimit": "perQueue"}
VISIBILITY_MAX_S = 43_200
COUNTED = ("ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
           "ApproximateNumberOfMessagesDelayed")
# Every name GetQueueAttributes answers (those a queue has), in SQS's API model's order.
ANSWERED = ("Policy", "VisibilityTimeout", "MaximumMessageSize", "MessageRetentionPeriod",
            *COUNTED[:2], "CreatedTimestamp", "LastModifiedTimestamp", "QueueArn", COUNTED[2],
            "DelaySeconds", "ReceiveMessageWaitTimeSeconds", "RedrivePolicy", "FifoQueue",
            "ContentBasedDeduplication", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds",
            "DeduplicationScope", "FifoThroughputLimit", "RedriveAllowPolicy",
            "SqsManagedSseEnabled")
UNSUPPORTED = ("Policy", "KmsMasterKeyId", "KmsDataKeyReusePeriodSeconds", "RedriveAllowPolicy")


def check_queue_name(name: object) -> str:
    """An SQS queue name: 1-80 characters of [A-Za-z0-9_-], `.fifo` included for a FIFO
    queue."""
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not NAME.fullmatch(
            name.removesuffix(FIFO_SUFFIX)):
        raise SqsError("InvalidParameterValue", "Can only include alphanumeric characters, "
                       "hyphens, or underscores. 1 to 80 in length (a FIFO queue's name ends "
                       "with .fifo, within the 80)")
    return name


def is_fifo(name: str) -> bool:
    return name.endswith(FIFO_SUFFIX)


def queue_arn(region: str, account: str, queue: str) -> str:
    return f"arn:aws:sqs:{region}:{account}:{queue}"


@dataclass(slots=True)
class Changes:
    """What CreateQueue's or SetQueueAttributes' attributes change: the kept attributes, the
    consumer's visibility (seconds) and its redrive (dead-letter queue and receives; a
    queue of None removes it, None leaves it)."""

    kept: dict[str, str] = field(default_factory=dict)
    visibility_s: int | None = None
    redrive: tuple[str | None, int] | None = None


def _integer(name: str, value: str, low: int, high: int) -> int:
    if not (value.isascii() and value.isdigit()) or not low <= int(value) <= high:
        raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter {name}: "
                       f"an integer from {low} to {high}")
    return int(value)


def parse_changes(given: Any, queue: str, creating: bool) -> Changes:
    """Check the attributes a call gives (values are strings, as SQS takes them)."""
    if given is None:
        given = {}
    if not isinstance(given, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in given.items()):
        raise SqsError("InvalidParameterValue", "Attributes must map names to strings")
    fifo = is_fifo(queue)
    out = Changes()
    for name, value in given.items():
        if name in UNSUPPORTED:
            raise SqsError("UnsupportedOperation", f"attribute {name} is not supported "
                           "(docs/sqs.md)")
        if name in NUMBERS:
            out.kept[name] = str(_integer(name, value, *NUMBERS[name]))
        elif name in CHOICES:
            if value not in CHOICES[name]:
                raise SqsError("InvalidAttributeValue", f"Invalid value for the parameter "
                               f"{name}: one of {', '.join(CHOICES[name])}")
            if name in FIFO_ONLY and not fifo:
                raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
            out.kept[name] = value
        elif name == "FifoQueue":
            if not creating:
                raise SqsError("InvalidAttributeName", "FifoQueue is set when the queue is "
                               "created")
            if value not in ("true", "false") or (value == "true") != fifo:
                raise SqsError("InvalidParameterValue", "The name of a FIFO queue can only "
                               "include alphanumeric characters, hyphens, or underscores, "
                               "must end with .fifo suffix and be 1 to 80 in length.")
        elif name == "VisibilityTimeout":
            out.visibility_s = _integer(name, value, 0, VISIBILITY_MAX_S)
        elif name == "RedrivePolicy":
            out.redrive = _redrive(value, fifo)
        else:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {name}.")
    if creating and fifo and given.get("FifoQueue") != "true":
        raise SqsError("InvalidParameterValue", "a queue whose name ends with .fifo is "
                       "created with the attribute FifoQueue true")
    return out


NO_REDRIVE = (None, NO_REDRIVE_ATTEMPTS)


def _redrive(value: str, fifo: bool) -> tuple[str | None, int]:
    if value == "":
        return NO_REDRIVE
    try:
        policy = json.loads(value)
    except ValueError:
        policy = None
    if not isinstance(policy, dict):
        raise SqsError("InvalidAttributeValue", "RedrivePolicy must be a JSON object with "
                       "deadLetterTargetArn and maxReceiveCount")
    arn, count = policy.get("deadLetterTargetArn"), policy.get("maxReceiveCount")
    if not isinstance(arn, str) or not arn.startswith("arn:") or arn.count(":") != 5:
        raise SqsError("InvalidAttributeValue", "Value for parameter RedrivePolicy is invalid. "
                       "Reason: Invalid value for deadLetterTargetArn.")
    dlq = arn.rsplit(":", 1)[1]
    check_queue_name(dlq)
    if is_fifo(dlq) != fifo:
        raise SqsError("InvalidParameterValue", "Value for parameter RedrivePolicy is invalid. "
                       "Reason: The dead-letter queue of a FIFO queue must also be a FIFO "
                       "queue, and of a standard queue a standard queue.")
    if isinstance(count, str) and count.isascii() and count.isdigit():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or \
            not 1 <= count <= MAX_RECEIVE_COUNT:
        raise SqsError("InvalidAttributeValue", "Value for parameter RedrivePolicy is invalid. "
                       f"Reason: maxReceiveCount must be an integer from 1 to "
                       f"{MAX_RECEIVE_COUNT}.")
    return dlq, count


def requested(names: Any) -> set[str]:
    """GetQueueAttributes' AttributeNames: `All`, or names of ANSWERED."""
    if names is None:
        return set()
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise SqsError("InvalidParameterValue", "AttributeNames must be a list of names")
    for n in names:
        if n != "All" and n not in ANSWERED:
            raise SqsError("InvalidAttributeName", f"Unknown Attribute {n}.")
    return set(ANSWERED) if "All" in names else set(names)
