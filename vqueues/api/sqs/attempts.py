"""ReceiveRequestAttemptId on FIFO queues: what a receive answered, kept by the node that
served it, so that the same receive retried with the same id within five minutes answers the
same messages with the same receipt handles (docs/sqs.md). In memory only, and bounded: the
oldest ids go first."""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from vqueues.api.sqs.protocol import SqsError

WINDOW_MS = 5 * 60 * 1000  # SQS's: an id is usable for five minutes after its receive
MAX_KEPT = 10_000  # ids kept per node, at most 10 messages each
_ATTEMPT_ID = re.compile(r"[\x21-\x7e]{1,128}")


def check_attempt_id(value: Any) -> str:
    """A ReceiveRequestAttemptId: 1 to 128 alphanumerics and punctuation (SQS's rule)."""
    if not isinstance(value, str) or not _ATTEMPT_ID.fullmatch(value):
        raise SqsError("InvalidParameterValue", "Value for parameter ReceiveRequestAttemptId "
                       "is invalid. Reason: 1 to 128 alphanumeric characters and punctuation "
                       "(!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~).")
    return value


@dataclass(slots=True)
class Answered:
    """One message a receive answered: its lease (token, attempt, deadline) and the time of
    its first receive."""

    offset: int
    token: str
    attempt: int
    deadline: int
    first: int


@dataclass(slots=True)
class Attempt:
    """A receive's answer under its attempt id; `at`: when it was answered (UTC ms)."""

    at: int
    messages: list[Answered]


class ReceiveAttempts:
    """The answers of the last receives with an attempt id, by (queue, id), oldest first: an
    id is dropped five minutes after its receive, or sooner when more than `limit` are kept."""

    __slots__ = ("_kept", "limit", "window_ms")

    def __init__(self, limit: int = MAX_KEPT, window_ms: int = WINDOW_MS) -> None:
        self.limit = limit
        self.window_ms = window_ms
        self._kept: OrderedDict[tuple[str, str], Attempt] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    def get(self, queue: str, attempt_id: str, now: int) -> Attempt | None:
        self._expire(now)
        return self._kept.get((queue, attempt_id))

    def keep(self, queue: str, attempt_id: str, attempt: Attempt) -> None:
        """Keep a receive's answer (an empty one is not kept: its retry receives anew)."""
        key = (queue, attempt_id)
        self._kept.pop(key, None)
        if attempt.messages:
            self._kept[key] = attempt
        self._expire(attempt.at)
        while len(self._kept) > self.limit:
            self._kept.popitem(last=False)

    def forget(self, queue: str, attempt_id: str) -> None:
        self._kept.pop((queue, attempt_id), None)

    def _expire(self, now: int) -> None:
        kept = self._kept
        while kept:
            key, oldest = next(iter(kept.items()))
            if oldest.at + self.window_ms > now:
                return
            del kept[key]
