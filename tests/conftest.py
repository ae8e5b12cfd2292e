"""Fixtures: the Kafka-compatible brokers tests run against, topics and nodes.

`bootstrap` is, in order of preference: an external Kafka/Redpanda named by VQ_TEST_BOOTSTRAP;
Redpanda started by testcontainers where a Docker engine answers (VQ_TEST_REDPANDA=0 turns that
off, =1 insists on it); otherwise the embedded broker (tansu) on a free loopback port.

`kafka_bootstrap` is real Apache Kafka: VQ_TEST_KAFKA_BOOTSTRAP, else a local three-broker cluster
(vqueues/kafka/local_cluster.py) started once per session, the first time a test asks for it.
A test marked `both_brokers` runs twice: on `bootstrap` and on that Kafka cluster.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import aiohttp
import pytest

from tests.support import NodeProcess, Topics, create_topics
from vqueues.kafka.broker import EmbeddedBroker
from vqueues.kafka.local_cluster import LocalKafkaCluster
from vqueues.kafka.maven import JarsUnavailable

UNIT_DIR = Path(__file__).parent / "unit"


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test marked `both_brokers` runs on the default broker and on real Kafka."""
    if (metafunc.definition.get_closest_marker("both_brokers")
            and "bootstrap" in metafunc.fixturenames):
        metafunc.parametrize("broker", ["default", "kafka"], indirect=True, scope="module")


def pytest_configure(config: pytest.Config) -> None:
    """A shard runs as a background job of scripts/test, which starts with SIGINT ignored:
    take it back, so that an interrupt tears the fixtures down (KeyboardInterrupt)."""
    if config.getoption("--shard") and signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--shard", default=None, metavar="K/N",
                     help="run only shard K of N (scripts/test runs the shards side by side)")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the unit tier (tests/unit/) before `-m` selects, keep only this run's shard, and
    run every test on the local Kafka cluster last, together: its three JVMs cost 13% of a
    core even idle, so they start only once the rest is done, and stop with the session."""
    for item in items:
        if UNIT_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.unit)
    shard = config.getoption("--shard")
    if shard:
        kept = _shard(items, shard)
        config.hook.pytest_deselected(items=[i for i in items if i not in kept])
        items[:] = [i for i in items if i in kept]
    items.sort(key=_on_kafka)  # stable: the order within each group is kept


DURATIONS = Path(__file__).parent / "durations.json"
# What shares files on disk (clients/typescript's npm install and build; Spark's and Maven's
# caches) or the local Kafka cluster runs in the first shard, whatever it weighs.
FIRST_SHARD = ("tests/test_typescript_client.py", "tests/test_typescript_growth.py",
               "tests/test_typescript_blackbox_riding.py", "tests/test_pipeline.py",
               "tests/test_local_kafka.py")


def _group(item: pytest.Item) -> str:
    """What runs in one shard: a test module on one broker (the unit tier as a whole)."""
    path = Path(str(item.fspath))
    name = "tests/unit" if UNIT_DIR in path.parents else \
        path.relative_to(Path(__file__).parent.parent).as_posix()
    return name + (" kafka" if _on_kafka(item) else "")


def _shard(items: list[pytest.Item], shard: str) -> set[pytest.Item]:
    """The items of shard K of N: groups dealt, heaviest first, to the lightest shard by the
    seconds tests/durations.json gives them (10 s for a group it does not know)."""
    try:
        k, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard {shard!r}: K/N, two whole numbers") from None
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard {shard!r}: K from 1 to N")
    weights: dict[str, float] = json.loads(DURATIONS.read_text())
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(_group(item), []).append(item)
    pinned = {g for g in groups if g.endswith(" kafka") or g.split(" ")[0] in FIRST_SHARD}
    chosen = dict.fromkeys(pinned, 0)
    loads = [sum(weights.get(g, 10.0) for g in pinned)] + [0.0] * (n - 1)
    for name in sorted(set(groups) - pinned, key=lambda g: (-weights.get(g, 10.0), g)):
        at = min(range(n), key=lambda i: (loads[i], i))
        chosen[name] = at
        loads[at] += weights.get(name, 10.0)
    return {i for name, members in groups.items() if chosen[name] == k - 1 for i in members}


_early: dict[str, Future[LocalKafkaCluster]] = {}
_kick: dict[str, pytest.Item | None] = {}


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Start the local Kafka cluster (about 20 s) in the background when the unit tier, the
    last thing before the Kafka tests, begins: the first Kafka test then finds it ready."""
    if "item" not in _kick:
        _kick["item"] = _head_start(item.session.items)
    if _kick["item"] is not item or os.environ.get("VQ_TEST_KAFKA_BOOTSTRAP"):
        return
    pool = ThreadPoolExecutor(1, thread_name_prefix="kafka-start")
    _early["cluster"] = pool.submit(LocalKafkaCluster().start)
    pool.shutdown(wait=False)


def _head_start(items: list[pytest.Item]) -> pytest.Item | None:
    """The first unit test before the first Kafka test (else that Kafka test), if any."""
    first = next((at for at, i in enumerate(items) if _on_kafka(i)), None)
    if first is None:
        return None
    at = first
    while at > 0 and UNIT_DIR in Path(str(items[at - 1].fspath)).parents:
        at -= 1
    return items[at]


def pytest_sessionfinish() -> None:
    """A cluster started early whose fixture never ran (a session that stopped before its
    Kafka tests, `-x` say) stops here, once its start is over."""
    started = _early.pop("cluster", None)
    if started is None:
        return
    try:
        cluster = started.result(timeout=300)
    except Exception:  # it did not start: nothing to stop
        return
    cluster.stop(kill=True)


def _on_kafka(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and callspec.params.get("broker") == "kafka":
        return True
    names = getattr(item, "fixturenames", ())
    return "kafka_bootstrap" in names or "kafka_cluster" in names


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
def default_bootstrap(broker_kind: str) -> Iterator[str]:
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
def kafka_cluster() -> Iterator[LocalKafkaCluster | None]:
    """The session's local Kafka cluster (None when VQ_TEST_KAFKA_BOOTSTRAP names one)."""
    if os.environ.get("VQ_TEST_KAFKA_BOOTSTRAP"):
        yield None
        return
    try:
        started = _early.pop("cluster", None)
        cluster = started.result() if started is not None else LocalKafkaCluster().start()
    except JarsUnavailable as exc:
        pytest.skip(f"needs real Apache Kafka: {exc}")
    try:
        yield cluster
    finally:
        cluster.stop(kill=True)  # its data goes with it: no controlled shutdown needed


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_cluster: LocalKafkaCluster | None) -> str:
    """Real Apache Kafka (three brokers, replication 3, min.insync.replicas 2)."""
    return kafka_cluster.bootstrap if kafka_cluster else os.environ["VQ_TEST_KAFKA_BOOTSTRAP"]


@pytest.fixture(scope="module")
def broker(request: pytest.FixtureRequest) -> str:
    """Which broker `bootstrap` is: "default" (see the module's docstring) or "kafka"."""
    return str(getattr(request, "param", "default"))


@pytest.fixture(scope="module")
def bootstrap(broker: str, request: pytest.FixtureRequest) -> str:
    return str(request.getfixturevalue("kafka_bootstrap" if broker == "kafka"
                                       else "default_bootstrap"))


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
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        yield s
