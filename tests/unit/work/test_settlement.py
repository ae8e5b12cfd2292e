"""Settling leased records: which tokens are current, and the window writes that settle them
(one delta per call, a checkpoint now and then, ADR 12)."""

import pytest

from vqueues.errors import VQError
from vqueues.records import (
    ConsumerAcked,
    ConsumerConfigured,
    DeliveryCleared,
    DeliveryUpdated,
    Record,
    WindowDelta,
    WindowKeyCleared,
)
from vqueues.state.cache import RecordCache
from vqueues.state.consumer_config import LEASE
from vqueues.state.partition_state import PartitionState
from vqueues.state.tokens import token
from vqueues.state.window_writes import CHECKPOINT_EVERY, WindowWrite
from vqueues.work import settlement

GRANT = 0x5A


def leased_state(offsets=(0, 2, 4, 6)):
    """Queue q with a lease consumer w at 0 holding leases on every record (attempt 1)."""
    s = PartitionState(0, RecordCache(1 << 20))
    s.generation = 3
    s.apply_records([("q", Record(o, 1, b"v", ())) for o in offsets], None)
    s.apply_offset_entries([ConsumerAcked("q", "w", 0, 0),
                            ConsumerConfigured("q", "w", LEASE, 5, None, 30_000)])
    work = s.windows[("q", "w")]
    write = WindowWrite(s, "q", "w", work)
    for o in offsets:
        write.put(o, True, 10**15, 1, GRANT, None)
    write.entries()
    return s


def settle(s, offsets, dead=0):
    write = WindowWrite(s, "q", "w", s.windows[("q", "w")])
    write.finish(list(offsets), dead)
    return write.entries()


def test_tokens_are_a_non_empty_list_without_repeats():
    assert settlement.parse_tokens(["3.1.a", "4.1", "3.1.a"]) == ["3.1.a", "4.1"]
    for bad in ("3.1", [], None, ["x"], [3], ["3.1.xyz"], ["3.1.2.4"]):
        with pytest.raises(VQError) as exc:
            settlement.parse_tokens(bad)
        assert exc.value.code == "invalid_token"


def test_a_token_of_another_attempt_or_grant_is_stale_and_a_done_one_is_already_done():
    s = leased_state()
    current = token(2, 1, GRANT)
    _, act, already = settlement.check_tokens(s, "q", "w", [current], True)
    assert act == [(current, 2)] and already == []
    for stale in (token(2, 2, GRANT), token(2, 1, GRANT + 2), token(2, 1)):
        with pytest.raises(VQError) as exc:
            settlement.check_tokens(s, "q", "w", [stale, token(4, 1, GRANT)], False)
        assert exc.value.code == "lease_expired" and exc.value.details["stale"] == [stale]
    settle(s, [2])
    assert settlement.check_tokens(s, "q", "w", [current], True)[2] == [current]
    with pytest.raises(VQError):
        settlement.check_tokens(s, "q", "w", [current], False)  # retry of a done record


def test_a_token_naming_no_record_of_the_queue_never_existed():
    """Below the consumer's mark, a token of another queue's record (or of no record) is
    stale, not done; one below the retained records (retention) counts as done."""
    s = leased_state((2, 4, 6))
    s.apply_records([("other", Record(8, 1, b"v", ()))], None)
    settle(s, [2, 4])
    assert s.committed("q", "w") == 6
    for foreign in (token(1, 1, GRANT), token(3, 1, GRANT), token(5, 1, GRANT)):
        with pytest.raises(VQError) as exc:
            settlement.check_tokens(s, "q", "w", [foreign], True)
        assert exc.value.code == "lease_expired"
        stale: list[str] = []
        assert settlement.check_tokens(s, "q", "w", [foreign], True, stale)[2] == []
        assert stale == [foreign]
    assert settlement.check_tokens(s, "q", "w", [token(4, 1, GRANT + 2)], True)[2] == [
        token(4, 1, GRANT + 2)]  # a done record, whichever of its tokens (documented)
    s.trim(5, ["q"])  # retention: 2 and 4 gone, and what 3 was cannot be told any more
    assert settlement.check_tokens(s, "q", "w", [token(3, 1, GRANT)], True)[2] == [
        token(3, 1, GRANT)]


def test_a_consumer_without_a_window_holds_no_lease():
    s = leased_state()
    with pytest.raises(VQError) as exc:
        settlement.check_tokens(s, "q", "nobody", [token(0, 1, GRANT)], True)
    assert exc.value.code == "lease_expired"


def test_one_write_per_call_moves_the_mark_over_the_done_run():
    s = leased_state()
    (above,) = settle(s, [4])
    assert isinstance(above, WindowDelta) and above.done == [4] and above.low_water is None
    (delta,) = settle(s, [0, 2])
    assert delta.low_water == 6 and s.committed("q", "w") == 6  # 0, 2 and 4 are done
    (dead,) = settle(s, [6], dead=1)
    assert dead.dead_lettered == 1 and dead.low_water == 7
    assert s.windows[("q", "w")].dead_lettered == 1


def test_a_checkpoint_supersedes_the_writes_before_it():
    s = leased_state(range(200))
    keys_before = None
    for i in range(CHECKPOINT_EVERY * 2):
        entries = settle(s, [i])
        if len(entries) > 1:
            checkpoint, *tombstones = entries[1:]
            assert isinstance(checkpoint, WindowDelta) and checkpoint.checkpoint
            assert checkpoint.low_water == s.committed("q", "w") == i + 1
            assert all(isinstance(t, WindowKeyCleared) for t in tombstones)
            keys_before = {(t.generation, t.seq) for t in tombstones}
            # every delta since the lease, the one just written with the checkpoint too
            assert keys_before == {(3, n) for n in range(1, entries[0].seq + 1)}
            break
    assert keys_before is not None and len(keys_before) == CHECKPOINT_EVERY
    assert list(s.windows[("q", "w")].log_keys) == [(3, None)]


def test_a_window_in_adr_8s_format_is_checkpointed_at_its_first_write():
    s = PartitionState(0, RecordCache(1 << 20))
    s.generation = 4
    s.apply_records([("q", Record(o, 1, b"v", ())) for o in (0, 1, 2)], None)
    s.apply_offset_entries([ConsumerAcked("q", "w", 0, 0),
                            ConsumerConfigured("q", "w", LEASE, 5, None, 30_000),
                            DeliveryUpdated("q", "w", 0, 1, 10**15, True, False),
                            DeliveryUpdated("q", "w", 1, 1, 10**15, True, False)])
    assert s.windows[("q", "w")].legacy
    settlement.check_tokens(s, "q", "w", [token(1, 1)], True)  # its tokens still work
    _, checkpoint, *tombstones = settle(s, [1])
    assert checkpoint.checkpoint and not s.windows[("q", "w")].legacy
    assert {t.offset for t in tombstones if isinstance(t, DeliveryCleared)} == {0, 1}
