"""Helpers for tests: node processes, topics, an HTTP client. Every process is stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition

from tests.narrow import known
from vqueues.hashing import partition_for
from vqueues.kafka import topics
from vqueues.kafka.admin import Admin
from vqueues.kafka.broker import free_port
from vqueues.kafka.ranges import OffsetRanges

LOGS = Path(os.environ.get("VQ_TEST_LOG_DIR", "/tmp/vqueues-test-logs"))

# Settings that make a first group join take seconds on the embedded broker. (A 4 s session
# saved little and made tansu lose a group's assignment during failover: kept at 6 s.)
FAST_GROUP = {"VQ_SESSION_TIMEOUT_MS": "6000", "VQ_HEARTBEAT_INTERVAL_MS": "500"}


@dataclass
class Topics:
    bootstrap: str
    prefix: str
    partitions: int

    @property
    def data(self) -> str:
        return f"{self.prefix}-data"

    @property
    def offsets(self) -> str:
        return f"{self.prefix}-offsets"

    @property
    def assignments(self) -> str:
        return f"{self.prefix}-assignments"

    @property
    def snapshots(self) -> str:
        return f"{self.prefix}-snapshots"

    def env(self) -> dict[str, str]:
        return {"VQ_BOOTSTRAP": self.bootstrap, "VQ_DATA_TOPIC": self.data,
                "VQ_OFFSET_TOPIC": self.offsets, "VQ_ASSIGNMENT_TOPIC": self.assignments,
                "VQ_SNAPSHOT_TOPIC": self.snapshots, "VQ_GROUP_ID": f"{self.prefix}-nodes"}


def create_topics(bootstrap: str, partitions: int = 16, prefix: str | None = None,
                  configs: dict[str, dict[str, str]] | None = None) -> Topics:
    """vqueues' four topics; `configs` adds topic settings by role ("data", "offsets", ...)."""
    t = Topics(bootstrap, prefix or f"t{uuid.uuid4().hex[:10]}", partitions)
    specs = topics.specs(t.data, t.offsets, t.assignments, partitions, snapshot_topic=t.snapshots)
    for role, extra in (configs or {}).items():
        name = getattr(t, role)
        for spec in specs:
            if spec.name == name:
                spec.config.update(extra)
    Admin({"bootstrap.servers": bootstrap}).create(specs)
    return t


@dataclass
class NodeProcess:
    """A `vqueues serve` process on a free loopback port."""

    topics: Topics
    node_id: str = field(default_factory=lambda: f"n{uuid.uuid4().hex[:6]}")
    extra_env: dict[str, str] = field(default_factory=dict)
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    ca_file: str | None = None  # set when the node serves HTTPS (VQ_TLS_CERT in extra_env)

    @property
    def url(self) -> str:
        scheme = "https" if "VQ_TLS_CERT" in self.extra_env else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(self, wait_ready: bool = True, timeout_s: float = 60.0) -> NodeProcess:
        self.port = self.port or free_port()
        LOGS.mkdir(parents=True, exist_ok=True)
        log = open(LOGS / f"{self.topics.prefix}-{self.node_id}.log", "ab")  # noqa: SIM115
        env = {**os.environ, **FAST_GROUP, **self.topics.env(), "VQ_HTTP_PORT": str(self.port),
               "VQ_NODE_ID": self.node_id, **self.extra_env}
        self.process = subprocess.Popen([sys.executable, "-m", "vqueues", "serve"], env=env,
                                        stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if wait_ready:
            self.wait_ready(timeout_s)
        return self

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited with {self.process.returncode}")
            status, _ = http("GET", f"{self.url}/readyz", ca_file=self.ca_file)
            if status == 200:
                return
            time.sleep(0.1)
        raise TimeoutError(f"node {self.url} not ready in {timeout_s}s")

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM and wait: the node leaves the group."""
        return self._signal(signal.SIGTERM, timeout_s)

    def kill(self) -> int:
        """SIGKILL: the node dies without leaving the group."""
        return self._signal(signal.SIGKILL, 10)

    def _signal(self, sig: int, timeout_s: float) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        rc = self.process.returncode
        self.process = None
        return rc


def http(method: str, url: str, body: Any = None, raw: bytes | None = None,
         timeout_s: float = 60.0, headers: dict[str, str] | None = None,
         ca_file: str | None = None) -> tuple[int, Any]:
    """A blocking JSON request: (status, decoded body or None); `ca_file` verifies HTTPS.
    Status 0: no answer (refused, reset, or none within `timeout_s`)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        with urllib.request.urlopen(req, timeout=timeout_s, context=context) as resp:
            return resp.status, _decode(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, _decode(exc.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        # urllib wraps connect errors in URLError, not a read timeout: a fault-tier load
        # thread would die of one.
        return 0, None


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return raw


def edit_watched_file(path: Path, change: Any) -> None:
    """Change a JSON file a node reloads when it changes (tokens, quotas): `change` edits the
    parsed content in place; the mtime moves 2 s ahead so the change is seen whatever the
    filesystem's timestamp resolution."""
    content = json.loads(path.read_text())
    change(content)
    path.write_text(json.dumps(content))
    os.utime(path, (time.time() + 2, time.time() + 2))


def queues_in_partition(partition: int, partitions: int, count: int, prefix: str = "q"
                        ) -> list[str]:
    """`count` queue names that all route to `partition`."""
    out: list[str] = []
    i = 0
    while len(out) < count:
        name = f"{prefix}-{i}"
        if partition_for(name, partitions) == partition:
            out.append(name)
        i += 1
    return out


def start_cluster(t: Topics, count: int, env: dict[int, dict[str, str]] | None = None
                  ) -> list[NodeProcess]:
    """`count` nodes on the same topics; returns once every partition is owned and ready."""
    nodes = [NodeProcess(t, node_id=f"node-{i}", extra_env=(env or {}).get(i, {}))
             for i in range(count)]
    try:
        for n in nodes:
            n.start(wait_ready=False)
        wait_settled(nodes, t.partitions)
    except BaseException:
        for n in nodes:
            n.kill()
        raise
    return nodes


def wait_settled(nodes: list[NodeProcess], partitions: int, timeout_s: float = 90.0,
                 ca_file: str | None = None) -> dict[int, str]:
    """Wait until the live nodes own every partition exactly once, all ready, every node owns
    some (when there are enough partitions: every node has joined the group; on Kafka the first
    node can own everything before the others join) and every node's cluster map agrees;
    returns partition -> owner URL."""
    deadline = time.monotonic() + timeout_s
    live = [n for n in nodes if n.process is not None]
    last: Any = None
    while time.monotonic() < deadline:
        owned: dict[int, str] = {}
        ok = True
        maps = []
        for n in live:
            status, body = http("GET", f"{n.url}/readyz", timeout_s=5, ca_file=ca_file)
            if status == 503:
                status = 200
            if status != 200:
                ok = False
                break
            for p in body["ready"]:
                ok &= p not in owned
                owned[p] = n.url
            maps.append({int(p): o["url"] for p, o in body["owners"].items()})
        last = (owned, maps)
        everyone = partitions < len(live) or set(owned.values()) == {n.url for n in live}
        if ok and len(owned) == partitions and everyone and all(m == owned for m in maps):
            return owned
        time.sleep(0.1)
    raise TimeoutError(f"cluster did not settle: {last}")


def cursor_counts(lag: int) -> dict[str, object]:
    """What `GET /v1/queues/{queue}` shows of a cursor consumer beside its offset and lag."""
    return {"mode": "cursor", "in_flight": 0, "delayed": 0, "available": lag,
            "dead_lettered": 0}


def make_certificates(directory: Path) -> tuple[str, str, str]:
    """A private CA and a server certificate it signs for 127.0.0.1, ::1 and localhost:
    returns (ca.pem, server.pem, server-key.pem) paths."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vqueues test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                x509.IPAddress(ipaddress.ip_address("::1"))]), critical=False)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = (directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(paths[0]), str(paths[1]), str(paths[2])


def kafka_records(bootstrap: str, topic: str) -> dict[tuple[int, int], Any]:
    """Everything in the topic, read with a plain consumer: (partition, offset) -> record."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                  "enable.partition.eof": True, "enable.auto.commit": False})
    parts = OffsetRanges({"bootstrap.servers": bootstrap}, topic).partitions()
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out: dict[tuple[int, int], Any] = {}
    eof: set[int] = set()
    while len(eof) < len(parts):
        m = c.poll(1.0)
        if m is None:
            continue
        error = m.error()
        if error:
            assert error.code() == KafkaError._PARTITION_EOF
            eof.add(known(m.partition()))
            continue
        out[(known(m.partition()), known(m.offset()))] = (
            known(m.key()).decode(), m.value(), m.timestamp()[1], tuple(m.headers() or ()))
    c.close()
    return out


# Helpers shared by the real-broker tests: requests, the command line, a node's log.

async def enqueue(client, node, queue, *values, headers=None):
    """Enqueue `values` to `queue` over HTTP; the 200 answer's body."""
    records = [{"value": v, **({"headers": headers} if headers else {})} for v in values]
    async with client.post(f"{node.url}/v1/queues/{queue}/records",
                           json={"records": records}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def read(client, node, queue, **params):
    """Read `queue` over HTTP; the 200 answer's body."""
    async with client.get(f"{node.url}/v1/queues/{queue}/records", params=params) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def post(node, path, body):
    """POST `body` as JSON to the node; the 200 answer's body."""
    status, out = http("POST", f"{node.url}{path}", body)
    assert status == 200, out
    return out


def vqueues_cli(*args, env=None, timeout=60):
    """`python -m vqueues ARGS`, run to its end."""
    return subprocess.run([sys.executable, "-m", "vqueues", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


# Snapshots every second once five records are new.
SNAPSHOT_FAST = {"VQ_SNAPSHOT_INTERVAL_S": "1", "VQ_SNAPSHOT_MIN_RECORDS": "5"}


def events(node, name):
    """The node's log events named `name`, in order."""
    path = LOGS / f"{node.topics.prefix}-{node.node_id}.log"
    out = []
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("event") == name:
            out.append(entry)
    return out


def wait_for(cond, timeout_s=30.0):
    """Poll `cond` until it holds; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def observe(node, queues):
    """What readers see: each queue's info and records."""
    out = {}
    for q in queues:
        status, info = http("GET", f"{node.url}/v1/queues/{q}")
        _, page = http("GET", f"{node.url}/v1/queues/{q}/records?offset=0&limit=1000")
        out[q] = (status, info if status == 200 else None,
                  [(r["offset"], r["value"]) for r in page["records"]])
    return out
