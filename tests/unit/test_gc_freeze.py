"""Long-lived objects leave the collector's scans once it tracks `gc_freeze_objects` of them
(outside the frozen ones); the garbage among them is collected first."""

import gc
import weakref

import pytest

from tests.unit.test_service import service  # noqa: F401  (the fixture)
from vqueues import memory
from vqueues.maintenance import Maintenance


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
    assert memory.freeze_long_lived(len(gc.get_objects()) + 1000) == 0  # under the limit
    assert dead() is not None and gc.get_freeze_count() == frozen
    assert memory.freeze_long_lived(1000) >= 6000
    assert dead() is None  # collected, not frozen
    assert gc.get_freeze_count() >= frozen + 6000
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in old + young)


async def test_maintenance_freezes_unless_a_snapshot_build_has_the_collector_off(
        service, thawed):  # noqa: F811
    object.__setattr__(service.settings, "gc_freeze_objects", 1)
    upkeep = Maintenance(service.settings, service.ownership, service)
    gc.disable()
    try:
        assert upkeep.freeze_long_lived() == 0
    finally:
        gc.enable()
    assert upkeep.freeze_long_lived() > 0
