"""The self-fence (vqueues/ownership/self_fence.py): a pause is seen, refused, confirmed away."""

import pytest

from vqueues.errors import VQError
from vqueues.ownership.self_fence import SelfFence


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_ticks_within_the_bound_never_fence():
    clock = Clock()
    fence = SelfFence(2.0, clock)
    for _ in range(100):
        clock.now += 0.1
        fence.tick()
        fence.check(1)
    assert (fence.epoch, fence.pauses, fence.stale()) == (0, 0, False)


def test_a_pause_refuses_until_the_group_confirms_that_epoch():
    clock = Clock()
    fence = SelfFence(2.0, clock)
    epoch = fence.epoch
    clock.now += 7.0  # stood still: the loop may run before the ticker does
    with pytest.raises(VQError) as err:
        fence.check(3)
    assert (err.value.code, err.value.status, err.value.retriable) == (
        "partition_unavailable", 503, True)
    with pytest.raises(VQError):  # a write begun before the pause: its outcome is unknown
        fence.check_since(epoch, 3)
    fence.tick()  # the ticker runs: the pause is a new epoch, still unconfirmed
    assert fence.epoch == epoch + 1 and fence.suspect
    with pytest.raises(VQError):
        fence.check(3)
    fence.confirmed(epoch)  # a confirmation of an older epoch does not count
    assert fence.stale()
    fence.confirmed(fence.epoch)
    fence.check(3)
    with pytest.raises(VQError):  # across the pause, still unknown; begun after it: fine
        fence.check_since(epoch, 3)
    fence.check_since(fence.epoch, 3)


def test_a_second_pause_before_the_confirmation_lands_needs_its_own():
    clock = Clock()
    fence = SelfFence(1.0, clock)
    clock.now += 5
    fence.tick()
    first = fence.epoch
    clock.now += 5
    fence.tick()
    fence.confirmed(first)  # confirmed what the group said before the second pause
    assert fence.stale() and fence.pauses == 2
    fence.confirmed(fence.epoch)
    assert not fence.stale()


def test_an_unbounded_fence_never_refuses():
    clock = Clock()
    fence = SelfFence(float("inf"), clock)
    clock.now += 1e9
    fence.check(0)
    fence.check_since(0, 0)
