"""Long-lived objects leave the collector's scans once it tracks `gc_freeze_objects` more of them
(outside the frozen ones) than the fewest since the last freeze; the garbage among them is
collected first, and requests in flight, which come and go, do not set it off."""

import gc
import weakref

import pytest

from vqueues import memory
from vqueues.upkeep.maintenance import Maintenance


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def thawed():
    yield
    gc.unfreeze()  # what the test froze is tracked again


def test_tracked_objects_are_collected_then_frozen_past_the_limit(thawed):
    old = [Cycle() for _ in range(3000)]
    dying = Cycle()
    dead = weakref.ref(dying)
    gc.collect()  # into the oldest generation
    del dying  # garbage now, in the oldest generation
    young = [Cycle() for _ in range(3000)]  # not collected yet: in the young generations
    frozen = gc.get_freeze_count()
    assert memory.Freezer(len(gc.get_objects()) + 1000).check() == 0  # under the limit
    assert dead() is not None and gc.get_freeze_count() == frozen
    assert memory.Freezer(1000).check() >= 6000
    assert dead() is None  # collected, not frozen
    assert gc.get_freeze_count() >= frozen + 6000
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in old + young)


def test_requests_in_flight_set_a_floor_and_only_growth_above_it_freezes(thawed):
    gc.collect()
    gc.freeze()
    freezer = memory.Freezer(2000)
    in_flight = [[i] for i in range(10_000)]
    assert freezer.check() >= 10_000  # from the start's floor of none: frozen
    in_flight = [[i] for i in range(10_000)]  # the next requests (the frozen ones are freed)
    assert freezer.check() == 0  # their number is the floor now
    for _ in range(3):  # the requests in flight change, their number does not
        in_flight = [[i] for i in range(10_000)]
        assert freezer.check() == 0
    del in_flight  # fewer requests: the floor follows them down
    assert freezer.check() == 0
    long_lived = [[i] for i in range(3000)]
    assert freezer.check() >= 3000  # grew by 3,000 over the floor: frozen
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in long_lived)


def test_a_limit_of_0_never_freezes(thawed):
    kept = [[i] for i in range(5000)]
    frozen = gc.get_freeze_count()
    assert memory.Freezer(0).check() == 0
    assert gc.get_freeze_count() == frozen and kept


async def test_maintenance_freezes_unless_a_snapshot_build_has_the_collector_off(
        service, thawed):
    object.__setattr__(service.settings, "gc_freeze_objects", 1)
    upkeep = Maintenance(service.settings, service.ownership, service)
    gc.disable()
    try:
        assert upkeep.freeze_long_lived() == 0
    finally:
        gc.enable()
    assert upkeep.freeze_long_lived() > 0


def test_a_long_collection_is_logged_with_its_own_cpu_time(caplog):
    pauses = memory.GcPauses(threshold_ms=0)  # every collection counts as long here
    pauses.install()
    try:
        with caplog.at_level("WARNING", logger="vqueues.memory"):
            gc.collect()
    finally:
        gc.callbacks.remove(pauses)
    logged = [r for r in caplog.records if r.getMessage() == "gc_pause"]
    assert logged and logged[-1].generation == 2
    assert 0 <= logged[-1].cpu_ms <= logged[-1].ms + 1
