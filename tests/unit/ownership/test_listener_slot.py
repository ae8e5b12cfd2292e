"""The next layout's group membership, held until the restarted node takes it (ADR 19)."""

import time
from collections.abc import Container, Sequence

from vqueues.ownership.listener_slot import ListenerSlot
from vqueues.records import Record
from vqueues.storage import Consumed


class _Listener:
    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def assigned(self, partitions: Sequence[int]) -> dict[int, int]:
        self.calls.append(("assigned", list(partitions)))
        return {}

    def revoked(self, partitions: Sequence[int], lost: bool) -> None:
        self.calls.append(("revoked", list(partitions)))

    def indexed(self, partition: int) -> Container[int]:
        return ()

    def consumed(self, batch: list[Consumed], high_watermarks: dict[int, int],
                 positions: dict[int, int]) -> None:
        self.calls.append(("consumed", [(p, r.offset) for p, _, r in batch], positions))

    def reached_end(self, partition: int, next_offset: int) -> None:
        self.calls.append(("end", partition, next_offset))

    def failed(self, error: str) -> None:
        self.calls.append(("failed", error))


def _rec(p: int, o: int) -> Consumed:
    return (p, b"q", Record(o, 0, b"v", ()))


def test_the_group_is_answered_at_once_and_what_it_brings_waits_for_the_listener() -> None:
    slot = ListenerSlot()
    assert slot.assigned([0, 1, 2]) == {}  # no wait: the other members are not held up
    assert slot.joined.is_set()
    slot.consumed([_rec(0, 0), _rec(1, 0)], {0: 1, 1: 1}, {0: 1, 1: 1})
    slot.revoked([1], lost=False)  # given to another member before the restart
    slot.reached_end(0, 1)
    slot.reached_end(1, 1)
    listener = _Listener()
    slot.attach(listener)
    deadline = time.monotonic() + 5
    while len(listener.calls) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert listener.calls == [("assigned", [0, 2]), ("consumed", [(0, 0)], {0: 1}),
                              ("end", 0, 1)]
    slot.consumed([_rec(2, 0)], {2: 1}, {2: 1})  # from now on, straight through
    assert listener.calls[-1] == ("consumed", [(2, 0)], {2: 1})


def test_a_slot_closed_before_any_listener_takes_nothing() -> None:
    slot = ListenerSlot()
    slot.assigned([0])
    slot.close()
    assert slot.assigned([1]) == {}
    slot.consumed([_rec(0, 0)], {}, {0: 1})
    listener = _Listener()
    slot.attach(listener)
    time.sleep(0.05)
    assert listener.calls == []
