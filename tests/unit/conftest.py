"""The unit tier: pure state, codecs and lifecycles through in-memory fakes; no broker.

Every test under tests/unit/ (its subfolders too) is marked `unit` (by tests/conftest.py), so
`scripts/test -m unit` runs this tier alone. The fixtures shared by its modules are here; the
plain helpers they use are in tests/unit/nodes.py.
"""

import pytest

from tests.unit.nodes import queue_service


@pytest.fixture
async def service():
    """A queue service over in-memory logs, owning both partitions (tests/unit/nodes.py)."""
    svc = await queue_service()
    yield svc
    svc.close()
