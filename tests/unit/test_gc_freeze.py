"""Long-lived objects leave the collector's full collections once its oldest generation gathers
`gc_freeze_objects` of them; the garbage among them is collected first."""

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
    gc.unfreeze()  # what the test froze goes back to the oldest generation


def test_the_oldest_generation_is_collected_then_frozen_past_the_limit(thawed):
    kept = [Cycle() for _ in range(5000)]
    dying = Cycle()
    dead = weakref.ref(dying)
    gc.collect()  # all of them into the oldest generation
    del dying  # garbage now, in the oldest generation
    frozen = gc.get_freeze_count()
    assert memory.freeze_long_lived(len(gc.get_objects(generation=2)) + 1) == 0  # under it
    assert dead() is not None and gc.get_freeze_count() == frozen
    assert memory.freeze_long_lived(1000) >= 5000
    assert dead() is None  # collected, not frozen
    assert gc.get_freeze_count() >= frozen + 5000
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert not any(id(k) in oldest for k in kept)


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
