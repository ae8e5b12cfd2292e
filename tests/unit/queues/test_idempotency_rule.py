"""One rule for "the same payload": what the user sent (value, headers, tags, and a schedule as
given), never what the node derived (docs/api.md, Idempotent enqueue)."""

import time

import pytest

from tests.unit.fakes import MemoryLog
from tests.unit.nodes import Owner
from vqueues.api import enqueue_body
from vqueues.settings import Settings
from vqueues.state.idempotency import KEY_HEADER, PAYLOAD_HEADER
from vqueues.state.schedule import DELIVER_AT_HEADER

pytestmark = pytest.mark.unit


@pytest.fixture
async def owner(monkeypatch):
    clock = [int(time.time() * 1000)]
    monkeypatch.setattr(enqueue_body, "now_ms", lambda: clock[0])
    logs = (MemoryLog(), MemoryLog(), MemoryLog())
    logs[0].timestamp = clock[0]
    node = await Owner(logs, Settings(write_visible_timeout_ms=1000)).start()
    node.clock = clock  # type: ignore[attr-defined]  # the test's clock rides on its node
    yield node
    node.close()


def written(node, queue):
    from vqueues.hashing import partition_for
    return node.data.partitions.get(partition_for(queue, 2), [])


async def test_a_key_repeated_in_one_request_with_another_payload_is_refused_and_nothing_written(
        owner):
    answer = await owner.send("q", [{"value": "e", "idempotency_key": "k5"},
                                    {"value": "plain"},
                                    {"value": "f", "idempotency_key": "k5"}])
    error = answer["error"]
    assert (error["code"], error["index"], error["first_index"]) == \
        ("idempotency_key_reused", 2, 0)
    assert written(owner, "q") == []
    same = await owner.send("q", [{"value": "e", "idempotency_key": "k5"},
                                  {"value": "e", "idempotency_key": "k5"}])
    assert same["offsets"][0] == same["offsets"][1] and len(written(owner, "q")) == 1


async def test_a_keyed_deliver_at_retried_after_its_due_time_answers_the_first_offset(owner):
    record = {"value": "v", "idempotency_key": "order-1", "deliver_at": owner.clock[0] + 500}
    first = await owner.send("s", [record])
    headers = dict(written(owner, "s")[0][2])
    assert DELIVER_AT_HEADER in headers and PAYLOAD_HEADER in headers
    owner.clock[0] += 1000  # now past its due time: sent again it would be delivered at once
    assert (await owner.send("s", [record]))["offsets"] == first["offsets"]
    other = await owner.send("s", [{**record, "deliver_at": record["deliver_at"] + 1}])
    assert other["error"]["code"] == "idempotency_key_reused"
    assert other["error"]["first_offset"] == first["offsets"][0]
    assert len(written(owner, "s")) == 1


async def test_a_keyed_delay_is_compared_as_given_not_as_the_due_time_it_makes(owner):
    record = {"value": "v", "idempotency_key": "job-1", "delay_ms": 5000}
    first = await owner.send("d", [record])
    owner.clock[0] += 70  # another due time would be derived from the same delay
    assert (await owner.send("d", [record]))["offsets"] == first["offsets"]
    refused = await owner.send("d", [{**record, "delay_ms": 6000}])
    assert refused["error"]["code"] == "idempotency_key_reused"
    plain = await owner.send("d", [{"value": "v", "idempotency_key": "job-1"}])
    assert plain["error"]["code"] == "idempotency_key_reused"  # unscheduled: another payload
    assert len(written(owner, "d")) == 1


async def test_tags_and_headers_are_part_of_the_payload(owner):
    base = {"value": "v", "idempotency_key": "t"}
    first = await owner.send("t", [{**base, "tags": ["red"]}])
    assert (await owner.send("t", [{**base, "tags": ["red"]}]))["offsets"] == first["offsets"]
    for other in ({**base, "tags": ["blue"]}, {**base, "tags": ["red"], "headers": {"h": "1"}}):
        assert (await owner.send("t", [other]))["error"]["code"] == "idempotency_key_reused"


async def test_a_keyed_record_a_kafka_producer_wrote_is_compared_by_what_it_holds(owner):
    due = str(owner.clock[0] + 60_000).encode()
    raw = [("x-trace", b"1"), (DELIVER_AT_HEADER, due), (KEY_HEADER, b"ext")]
    first = await owner.svc.enqueue("k", [(b"v", raw)])
    assert (await owner.svc.enqueue("k", [(b"v", raw)])).offsets == first.offsets
    answer = await owner.send("k", [{"value": "v", "idempotency_key": "ext",
                                     "headers": {"x-trace": "1"}}])
    assert answer["error"]["first_offset"] == first.offsets[0]  # its due time was sent too


async def test_a_payload_header_sent_by_the_user_is_replaced():
    from vqueues.api.enqueue_body import decode_enqueue

    settings = Settings()
    body = (b'{"records": [{"value": "v", "idempotency_key": "k", '
            b'"headers": {"vq-idempotency-payload": "0000000000000001"}}]}')
    [(_, headers)] = decode_enqueue(body, settings)
    assert PAYLOAD_HEADER not in dict(headers)
