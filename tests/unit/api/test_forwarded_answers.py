"""A forwarding node's multi-queue enqueue: the owner's answers, about the request sent on to
it, name records by their place in the request the client sent."""

from typing import Any

import pytest

from vqueues.api.multi import _in_this_request

pytestmark = pytest.mark.unit


def test_a_forwarded_records_error_names_it_by_its_place_in_the_clients_request():
    indices = [2, 5, 9]  # the client's records 2, 5 and 9 went to this owner, in that order
    theirs: dict[str, Any] = {"queue": "q", "partition": 3, "status": 409, "error": {
        "code": "idempotency_key_reused", "retriable": False, "index": 2, "first_index": 0,
        "first_offset": None,
        "message": "records[2]: idempotency key already given to records[0] of this request"}}
    ours = _in_this_request(theirs, indices)
    assert (ours["error"]["index"], ours["error"]["first_index"]) == (9, 2)
    assert ours["error"]["message"] == ("records[9]: idempotency key already given to "
                                        "records[2] of this request")
    assert theirs["error"]["index"] == 2  # the owner's answer is not changed in place


def test_a_refusal_of_the_forwarded_request_as_a_whole_is_told_in_the_clients_places():
    # an owner with a lower max_record_bytes refuses what this node let through
    refused = {"queue": "q", "partition": 3, "status": 413, "error": {
        "code": "record_too_large", "retriable": False, "max": 10,
        "message": "records[1] is 11 bytes; at most 10"}}
    assert _in_this_request(refused, [4, 7])["error"]["message"] == \
        "records[7] is 11 bytes; at most 10"


@pytest.mark.parametrize("answer", [
    {"queue": "q", "partition": 0, "offset": 12},
    {"queue": "q", "partition": 0, "status": 409, "error": {"code": "wrong_node"}},
    "not an object",
])
def test_answers_without_record_indices_pass_through(answer):
    assert _in_this_request(answer, [4, 7]) == answer
