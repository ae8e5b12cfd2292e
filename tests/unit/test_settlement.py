"""Settling leased records: which tokens are current, and the entries that move the mark."""

import pytest

from vqueues import settlement
from vqueues.cache import RecordCache
from vqueues.errors import VQError
from vqueues.leases import LEASE, token
from vqueues.partition_state import PartitionState
from vqueues.records import (
    ConsumerAcked,
    ConsumerConfigured,
    DeliveryCleared,
    DeliveryUpdated,
    Record,
)


def leased_state(offsets=(0, 2, 4, 6)):
    """Queue q with a lease consumer w at 0 holding leases on every record (attempt 1)."""
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("q", Record(o, 1, b"v", ())) for o in offsets], None)
    s.apply_offset_entries([ConsumerAcked("q", "w", 0, 0),
                            ConsumerConfigured("q", "w", LEASE, 5, None, 30_000)])
    s.apply_offset_entries([DeliveryUpdated("q", "w", o, 1, 10**15, True, False)
                            for o in offsets])
    return s


def test_tokens_are_a_non_empty_list_without_repeats():
    assert settlement.parse_tokens("3.1") == ["3.1"]
    assert settlement.parse_tokens(["3.1", "4.1", "3.1"]) == ["3.1", "4.1"]
    for bad in ([], None, ["x"], [3]):
        with pytest.raises(VQError) as exc:
            settlement.parse_tokens(bad)
        assert exc.value.code == "invalid_token"


def test_a_token_of_another_attempt_is_stale_and_a_done_one_is_already_done():
    s = leased_state()
    work, act, already = settlement.check_tokens(s, "q", "w", [token(2, 1)], True)
    assert act == [(token(2, 1), 2)] and already == []
    with pytest.raises(VQError) as exc:
        settlement.check_tokens(s, "q", "w", [token(2, 2), token(4, 1)], False)
    assert exc.value.code == "lease_expired" and exc.value.details["stale"] == [token(2, 2)]
    s.apply_offset_entries(settlement.settle(s, "q", "w", work, [2]))
    assert settlement.check_tokens(s, "q", "w", [token(2, 1)], True)[2] == [token(2, 1)]
    with pytest.raises(VQError):
        settlement.check_tokens(s, "q", "w", [token(2, 1)], False)  # retry of a done record


def test_a_consumer_without_a_window_holds_no_lease():
    s = leased_state()
    with pytest.raises(VQError) as exc:
        settlement.check_tokens(s, "q", "nobody", [token(0, 1)], True)
    assert exc.value.code == "lease_expired"


def test_settling_moves_the_mark_over_the_done_run_and_marks_the_rest_done():
    s = leased_state()
    work = s.work[("q", "w")]
    above = settlement.settle(s, "q", "w", work, [4])
    assert above == [DeliveryUpdated("q", "w", 4, 0, 0, False, True)]  # 0 still leased
    s.apply_offset_entries(above)
    entries = settlement.settle(s, "q", "w", work, [0, 2])
    acked = entries[0]
    assert isinstance(acked, ConsumerAcked) and acked.offset == 6  # 0, 2 and 4 are done
    assert [e.offset for e in entries[1:]] == [0, 2, 4]
    assert all(isinstance(e, DeliveryCleared) for e in entries[1:])
    dead = settlement.settle(s, "q", "w", work, [6], dead=1)
    assert isinstance(dead[0], ConsumerAcked) and dead[0].dead_lettered == 1
