"""One round trip per cycle (ADR 16): grants answered from memory and written behind the answer
(or before it, with `durable_grants`), and completions riding on the next lease, token by token,
in the same offset-topic write as its grants, answered once that write is durable; and a
stream's credit carrying completions the same way."""

import asyncio

import pytest

from tests.unit.nodes import fill, work_node
from vqueues.errors import VQError
from vqueues.state.tokens import parse_token

pytestmark = pytest.mark.unit


async def test_a_lease_answers_before_its_grants_are_written_unless_durable(node):
    svc, work, _, offset_log = node
    await fill(svc, "behind", 4)
    await work.configure("behind", "w", "lease", None, False, None)  # made before the hold
    await work.configure("durable", "w", "lease", None, False, None, durable_grants=True)
    await fill(svc, "durable", 4)
    offset_log.hold = True  # writes stay in flight
    got = await asyncio.wait_for(work.lease("behind", "w", 2, 60_000, 0), 1)
    assert len(got.records) == 2  # answered from memory
    waiting = asyncio.ensure_future(work.lease("durable", "w", 2, 60_000, 0))
    await asyncio.sleep(0.05)
    assert not waiting.done()  # today's promise: answered once written
    assert await offset_log.crash() >= 1
    with pytest.raises(ConnectionError):
        await waiting
    assert svc.metrics.grant_writes_failed._value.get() >= 1


async def test_completions_ride_on_a_lease_in_one_write_answered_token_by_token(node):
    svc, work, *_ = node
    await fill(svc, "cycle", 6)
    first = await work.lease("cycle", "w", 3, 60_000, 0)
    tokens = [r.token for r in first.records]
    writes = svc.entries.writes
    off, attempt, grant = parse_token(tokens[0]) or (0, 0, 0)
    stale = f"{off}.{attempt + 1}.{grant}"  # a delivery that never happened
    second = await work.lease("cycle", "w", 3, 60_000, 0,
                              complete=[*tokens, tokens[0], stale, "nope"])
    assert svc.entries.writes == writes + 1  # the completions and the grants: one write
    assert second.completed == tokens
    assert [(r.token, r.code) for r in second.refused or []] == [
        ("nope", "invalid_token"), (stale, "lease_expired")]
    assert [r.record.offset for r in second.records] == \
        [r.record.offset + 3 for r in first.records]
    info = svc.queue_info("cycle").consumers[0]
    assert (info.offset, info.in_flight) == (first.records[-1].record.offset + 1, 3)
    again = await work.lease("cycle", "w", 1, 60_000, 0, complete=tokens)
    assert again.completed == tokens and again.refused == []  # done already: idempotent
    assert again.records == []
    plain = await work.lease("cycle", "w", 1, 60_000, 0)
    assert plain.completed is None and plain.refused is None


async def test_a_lease_with_completions_answers_only_once_they_are_durable(node):
    svc, work, *_ = node
    await fill(svc, "dur", 4)
    first = await work.lease("dur", "w", 2, 60_000, 0)
    await _unanswered_and_not_promised(node, "dur", first, work.lease(
        "dur", "w", 2, 60_000, 0, complete=[r.token for r in first.records]))


async def _unanswered_and_not_promised(node, queue, first, completing) -> None:
    """`completing` is not answered while its write is held, fails when the writer dies, and a
    new owner has both records leased as the last write left them."""
    svc, _, data_log, offset_log = node
    offset_log.hold = True
    riding = asyncio.ensure_future(completing)
    await asyncio.sleep(0.05)
    assert not riding.done()
    await offset_log.crash()
    with pytest.raises(ConnectionError):
        await riding
    svc2, _ = await work_node(data_log, offset_log, svc.settings)
    try:
        info = svc2.queue_info(queue).consumers[0]
        assert (info.offset, info.in_flight) == (first.records[0].record.offset, 2)
    finally:
        svc2.close()


async def test_a_long_poll_writes_its_completions_at_once_then_waits_for_records(node):
    svc, work, *_ = node
    await fill(svc, "lp", 1)
    first = await work.lease("lp", "w", 1, 60_000, 0)
    riding = asyncio.ensure_future(work.lease("lp", "w", 1, 60_000, 5000,
                                              complete=[first.records[0].token]))
    await asyncio.sleep(0.1)
    assert not riding.done()
    info = svc.queue_info("lp").consumers[0]
    assert (info.in_flight, info.lag) == (0, 0)  # completed while the poll waits
    [later] = await fill(svc, "lp", 1)
    page = await asyncio.wait_for(riding, 2)
    assert page.completed == [first.records[0].token]
    assert [r.record.offset for r in page.records] == [later]


async def test_riding_completions_and_the_grants_are_one_offset_topic_entry(node):
    svc, work, data_log, offset_log = node
    await fill(svc, "one", 6)
    first = await work.lease("one", "w", 3, 60_000, 0)
    p = svc.partition_of("one")
    before = len(offset_log.partitions.get(p, []))
    second = await work.lease("one", "w", 3, 60_000, 0,
                              complete=[r.token for r in first.records])
    assert len(second.completed or []) == 3 and len(second.records) == 3
    assert len(offset_log.partitions[p]) == before + 1  # one window delta, not two
    # Replayed, it says both: the first three done, the next three leased.
    svc2, _ = await work_node(data_log, offset_log, svc.settings)
    try:
        info = svc2.queue_info("one").consumers[0]
        assert (info.offset, info.in_flight) == (first.records[-1].record.offset + 1, 3)
    finally:
        svc2.close()


async def test_riding_completions_are_not_answered_from_a_partition_that_moved(node):
    svc, work, *_ = node
    await fill(svc, "moved", 2)
    first = await work.lease("moved", "w", 2, 60_000, 0)
    svc.ownership.states[svc.partition_of("moved")].revoked = True  # moved mid-call
    with pytest.raises(VQError):
        await work.lease("moved", "w", 2, 60_000, 0, complete=[r.token for r in first.records])


async def test_a_streams_credit_completes_its_tokens_token_by_token_in_one_write(node):
    svc, work, *_ = node
    await fill(svc, "credit", 4)
    first = await work.lease("credit", "w", 3, 60_000, 0)
    tokens = [r.token for r in first.records]
    off, attempt, grant = parse_token(tokens[0]) or (0, 0, 0)
    stale = f"{off}.{attempt + 1}.{grant}"  # a delivery that never happened
    writes = svc.entries.writes
    got = await work.complete_riding("credit", "w", [*tokens, tokens[1], stale, "nope"])
    assert svc.entries.writes == writes + 1  # every completion: one write
    assert got.completed == tokens  # the repeat dropped
    assert [(r.token, r.code) for r in got.refused] == [
        ("nope", "invalid_token"), (stale, "lease_expired")]
    info = svc.queue_info("credit").consumers[0]
    assert (info.offset, info.in_flight) == (first.records[-1].record.offset + 1, 0)
    again = await work.complete_riding("credit", "w", tokens)
    assert (again.completed, again.refused) == (tokens, [])  # done already: idempotent
    assert svc.entries.writes == writes + 1  # nothing new to write
    # A consumer that holds no lease: none of its tokens is current.
    none = await work.complete_riding("credit", "other", tokens[:1])
    assert [(r.token, r.code) for r in none.refused] == [(tokens[0], "lease_expired")]
    await work.configure("credit", "reader", "cursor", None, False, None)
    with pytest.raises(VQError) as exc:
        await work.complete_riding("credit", "reader", tokens[:1])
    assert exc.value.code == "consumer_mode_mismatch"


async def test_a_streams_credit_completions_are_answered_only_once_durable(node):
    svc, work, *_ = node
    await fill(svc, "cdur", 2)
    first = await work.lease("cdur", "w", 2, 60_000, 0)
    await asyncio.sleep(0.05)  # the grants' write behind lands
    await _unanswered_and_not_promised(node, "cdur", first, work.complete_riding(
        "cdur", "w", [r.token for r in first.records]))
