"""The unit tier: pure state, codecs and lifecycles through in-memory fakes; no broker.

Every test under tests/unit/ (its subfolders too) is marked `unit` (by tests/conftest.py), so
`scripts/test -m unit` runs this tier alone. The fixtures shared by its modules are here; the
plain helpers they use are in tests/unit/nodes.py.
"""

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.unit.fakes import MemoryLog
from tests.unit.nodes import queue_service, work_node
from vqueues.api.app import create_app
from vqueues.ownership import node_status
from vqueues.settings import Settings


@pytest.fixture
async def service():
    """A queue service over in-memory logs, owning both partitions (tests/unit/nodes.py)."""
    svc = await queue_service()
    yield svc
    svc.close()


@pytest.fixture
def settings():
    """The settings of the `node` fixture (a module overrides this fixture to change them)."""
    return Settings(write_visible_timeout_ms=1000, max_lease_window=50)


@pytest.fixture
async def node(settings):
    """A node over in-memory logs owning both partitions: (queue service, work service, data
    log, offset log); a new node over the same logs replays them (`nodes.work_node`)."""
    data_log, offset_log = MemoryLog(), MemoryLog()
    svc, work = await work_node(data_log, offset_log, settings)
    yield svc, work, data_log, offset_log
    svc.close()


@pytest.fixture
def logs():
    """The offset and assignment logs of an Ownership (`nodes.ownership_of`)."""
    return MemoryLog(), MemoryLog()


@pytest.fixture
def app_settings():
    """The settings of the `api` fixture's app; a module overrides this fixture to change them."""
    return Settings(write_visible_timeout_ms=1000)


@pytest.fixture
async def api(app_settings):
    """An aiohttp TestClient on the node's HTTP app (`create_app`) over an in-memory queue
    service owning every partition: real routes, middlewares and codecs, no broker. Requests
    take paths (`await api.get("/v1/queues")`)."""
    svc = await queue_service(app_settings)
    node_status.register_gauges(svc.ownership)  # as the node does: /metrics shows them
    server = TestServer(create_app(svc, app_settings))
    # As the node runs it (vqueues/node.py): bodies are decoded by the handlers, not aiohttp.
    await server.start_server(auto_decompress=False, access_log=None)
    async with TestClient(server) as client:
        yield client
    svc.close()
