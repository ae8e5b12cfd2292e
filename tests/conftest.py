"""Fixtures: the Kafka-compatible broker every test runs against, topics and nodes.

The broker is, in order of preference: an external Kafka/Redpanda named by VQ_TEST_BOOTSTRAP;
Redpanda started by testcontainers where a Docker engine answers (VQ_TEST_REDPANDA=0 turns that
off, =1 insists on it); otherwise the embedded broker (tansu) on a free loopback port.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from tests.support import NodeProcess, Topics, create_topics
from vqueues.broker import EmbeddedBroker

UNIT_DIR = Path(__file__).parent / "unit"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the unit tier (tests/unit/) before `-m` selects."""
    for item in items:
        if UNIT_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.unit)


def _docker_engine() -> bool:
    """Does a Docker engine answer? (A plain /_ping, so no client socket is left open.)"""
    if os.environ.get("VQ_TEST_REDPANDA") == "0":
        return False
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    answered = False
    try:
        if host.startswith("unix://"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(3)
                s.connect(host[len("unix://"):])
                s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
                status_line = s.recv(1024).split(b"\r\n", 1)[0]
                answered = status_line.startswith(b"HTTP/1.") and b" 200" in status_line
        else:
            hostport = host.split("://", 1)[-1]
            h, _, port = hostport.rpartition(":")
            with socket.create_connection((h, int(port)), timeout=3):
                answered = True
    except OSError:
        answered = False
    if not answered and os.environ.get("VQ_TEST_REDPANDA") == "1":
        raise RuntimeError("VQ_TEST_REDPANDA=1 but no Docker engine answers")
    return answered


def _redpanda() -> Iterator[str]:
    from testcontainers.kafka import RedpandaContainer

    def gen() -> Iterator[str]:
        with RedpandaContainer() as rp:
            yield rp.get_bootstrap_server()

    return gen()


@pytest.fixture(scope="session")
def broker_kind() -> str:
    if os.environ.get("VQ_TEST_BOOTSTRAP"):
        return "external"
    if _docker_engine():
        return "redpanda"
    return "embedded"


@pytest.fixture(scope="session")
def bootstrap(broker_kind: str) -> Iterator[str]:
    external = os.environ.get("VQ_TEST_BOOTSTRAP")
    if external:
        yield external
        return
    if broker_kind == "redpanda":
        yield from _redpanda()
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
        pytest.skip("needs real Kafka/Redpanda semantics the embedded broker (tansu) lacks "
                    "(delete_records, retention); set VQ_TEST_BOOTSTRAP or run where Docker "
                    "is available to run it")


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
