"""Fixtures: the Kafka-compatible broker every test runs against, topics and nodes.

The broker is, in order of preference: an external Kafka/Redpanda named by VQ_TEST_BOOTSTRAP;
Redpanda started by testcontainers when VQ_TEST_REDPANDA=1 and a Docker engine is reachable;
otherwise the embedded broker (tansu) on a free loopback port.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import aiohttp
import pytest

from tests.support import NodeProcess, Topics, create_topics
from vqueues.broker import EmbeddedBroker


def _redpanda() -> Iterator[str] | None:
    if os.environ.get("VQ_TEST_REDPANDA") != "1":
        return None
    try:
        import docker

        docker.from_env().ping()
    except Exception:
        return None
    from testcontainers.kafka import RedpandaContainer

    def gen() -> Iterator[str]:
        with RedpandaContainer() as rp:
            yield rp.get_bootstrap_server()

    return gen()


@pytest.fixture(scope="session")
def broker_kind() -> str:
    if os.environ.get("VQ_TEST_BOOTSTRAP"):
        return "external"
    if os.environ.get("VQ_TEST_REDPANDA") == "1":
        return "redpanda"
    return "embedded"


@pytest.fixture(scope="session")
def bootstrap(broker_kind: str) -> Iterator[str]:
    external = os.environ.get("VQ_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    rp = _redpanda()
    if rp is not None:
        yield from rp
        return
    broker = EmbeddedBroker().start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def real_kafka(broker_kind: str) -> None:
    """Skips a test that needs real Kafka semantics on the embedded broker."""
    if broker_kind == "embedded":
        pytest.skip("needs real Kafka/Redpanda semantics the embedded broker (tansu) lacks; "
                    "set VQ_TEST_BOOTSTRAP or VQ_TEST_REDPANDA=1 to run it")


@pytest.fixture(scope="module")
def topics(bootstrap: str) -> Topics:
    return create_topics(bootstrap, partitions=16)


@pytest.fixture(scope="module")
def node(topics: Topics) -> Iterator[NodeProcess]:
    """One node owning every partition of the module's topics."""
    n = NodeProcess(topics).start()
    try:
        yield n
    finally:
        n.terminate()


@pytest.fixture
async def client() -> aiohttp.ClientSession:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        yield s
