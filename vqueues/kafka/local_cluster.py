"""A local Apache Kafka cluster for development, tests and benchmarks: KRaft processes on
loopback, each a combined broker and controller, run from Kafka's own jars.

The jars come from Maven Central through `local-kafka.pom.xml` (which pins the release) into a
cache on first use (`vqueues.kafka.maven`).
Without Java or Maven, `start()` raises `vqueues.kafka.maven.JarsUnavailable` saying which. Every
process is started here and stopped here by PID.
"""

from __future__ import annotations

import base64
import logging
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from confluent_kafka.admin import AdminClient

from vqueues.kafka.broker import free_port, stop_process
from vqueues.kafka.maven import fetch_jars, java

log = logging.getLogger(__name__)

POM = Path(__file__).with_name("local-kafka.pom.xml")
KAFKA_VERSION = re.search(r"<kafka.version>([^<]+)</kafka.version>",
                          POM.read_text()).group(1)  # type: ignore[union-attr]

# Broker settings of the local cluster. Replication 3 with min.insync.replicas 2 for every topic
# (vqueues' own included), so one broker can be lost without losing an acknowledged write.
# The timers are shorter than Kafka's defaults so tests see a lost broker fenced in seconds and
# compaction and retention act within seconds; they are otherwise Kafka's defaults.
BROKER_CONFIG = {
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "10",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "transaction.state.log.num.partitions": "10",
    "share.coordinator.state.topic.replication.factor": "3",
    "share.coordinator.state.topic.min.isr": "2",
    "share.coordinator.state.topic.num.partitions": "10",
    "num.partitions": "1",
    "auto.create.topics.enable": "false",
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "broker.session.timeout.ms": "6000",
    "broker.heartbeat.interval.ms": "1000",
    "log.retention.check.interval.ms": "2000",
    "log.cleaner.backoff.ms": "1000",
    "num.network.threads": "2",
    "num.io.threads": "4",
}

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = ${sys:kafka.logs.dir}/server.log
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.kafka.additivity = false
logger.kafka.appenderRef.file.ref = FILE
"""


def cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def format_arguments(cid: str, config_file: Path) -> list[str]:
    """The storage tool's arguments; ``--cluster-id=`` keeps an id that starts with ``-`` (one
    in 64 ids) from being read as an option."""
    return ["format", f"--cluster-id={cid}", f"--config={config_file}"]


@dataclass
class KafkaProcess:
    """One KRaft process of the cluster: a broker and a controller."""

    node_id: int
    port: int
    controller_port: int
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def config_file(self) -> Path:
        return self.folder / "server.properties"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


class LocalKafkaCluster:
    """`brokers` KRaft processes (each broker and controller) on loopback, data under a folder
    (a temporary one unless given), stopped by PID."""

    def __init__(self, brokers: int = 3, folder: Path | None = None, heap_mb: int = 768,
                 config: dict[str, str] | None = None) -> None:
        self.size = brokers
        self.heap_mb = heap_mb
        self.config = {**BROKER_CONFIG, **(config or {})}
        if brokers < 3:  # replication 3 needs three brokers; a smaller cluster uses what it has
            self.config.update({k: str(min(int(self.config[k]), brokers)) for k in (
                "default.replication.factor", "offsets.topic.replication.factor",
                "transaction.state.log.replication.factor",
                "share.coordinator.state.topic.replication.factor")})
            self.config.update({k: str(min(int(self.config[k]), max(1, brokers - 1)))
                                for k in ("min.insync.replicas", "transaction.state.log.min.isr",
                                          "share.coordinator.state.topic.min.isr")})
        self._own_folder = folder is None
        self.folder = folder or Path()  # a temporary one is made by start()
        self.processes: list[KafkaProcess] = []
        self._java = ""
        self._libs = Path()

    @property
    def bootstrap(self) -> str:
        return ",".join(p.address for p in self.processes)

    def start(self, timeout_s: float = 120.0) -> LocalKafkaCluster:
        """Fetch the jars if needed, format and start every process, wait until all answer."""
        self._java = java("the local Kafka cluster")
        self._libs = fetch_jars(POM)
        if self._own_folder:
            self.folder = Path(tempfile.mkdtemp(prefix="vq-kafka-"))
        if not self._own_folder and any(self.folder.glob("kafka-*")):
            raise RuntimeError(f"{self.folder} already holds a cluster's data: give an empty "
                               "folder")
        started = time.monotonic()
        self.processes = [KafkaProcess(i + 1, free_port(), free_port(),
                                       self.folder / f"kafka-{i + 1}") for i in range(self.size)]
        voters = ",".join(f"{p.node_id}@127.0.0.1:{p.controller_port}" for p in self.processes)
        cid = cluster_id()
        for p in self.processes:
            p.folder.mkdir(parents=True, exist_ok=True)
            (p.folder / "log4j2.properties").write_text(LOG4J2)
            props = {
                "process.roles": "broker,controller", "node.id": str(p.node_id),
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://{p.address},CONTROLLER://127.0.0.1:{p.controller_port}",
                "advertised.listeners": f"PLAINTEXT://{p.address}",
                "controller.listener.names": "CONTROLLER",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "inter.broker.listener.name": "PLAINTEXT",
                "log.dirs": str(p.folder / "data"),
                **self.config}
            p.config_file.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        formats = [subprocess.Popen(
            [self._java, "-cp", f"{self._libs}/*", *self._log_flags(p), "kafka.tools.StorageTool",
             *format_arguments(cid, p.config_file)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for p in self.processes]
        try:
            for p, f in zip(self.processes, formats, strict=True):
                out, _ = f.communicate(timeout=60)
                if f.returncode != 0:
                    raise RuntimeError(f"formatting Kafka node {p.node_id} failed: "
                                       f"{out.decode(errors='replace')[-2000:]}")
        finally:
            for f in formats:  # one failed: the others are stopped, not left running
                if f.poll() is None:
                    f.kill()
                    f.wait()
        try:
            for p in self.processes:
                self.start_broker(p.node_id, wait=False)
            self.wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        log.info("kafka_cluster_started", extra={
            "bootstrap": self.bootstrap, "version": KAFKA_VERSION, "folder": str(self.folder),
            "pids": [p.process.pid for p in self.processes if p.process],
            "seconds": round(time.monotonic() - started, 1)})
        return self

    def _log_flags(self, p: KafkaProcess) -> list[str]:
        return [f"-Dlog4j2.configurationFile=file:{p.folder / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={p.folder}"]

    def process(self, node_id: int) -> KafkaProcess:
        return self.processes[node_id - 1]

    def start_broker(self, node_id: int, wait: bool = True, timeout_s: float = 60.0) -> None:
        """Start (or restart, keeping its data) one process."""
        p = self.process(node_id)
        if p.running:
            return
        p._log = open(p.folder / "stdout.log", "ab")  # noqa: SIM115 (closed in stop_broker)
        p.process = subprocess.Popen(
            [self._java, f"-Xms{min(256, self.heap_mb)}m", f"-Xmx{self.heap_mb}m",
             "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20", "-XX:+ExitOnOutOfMemoryError",
             "-Djava.awt.headless=true", *self._log_flags(p), "-cp", f"{self._libs}/*",
             "kafka.Kafka", str(p.config_file)],
            stdout=p._log, stderr=subprocess.STDOUT)
        log.info("kafka_broker_started", extra={"node_id": node_id, "pid": p.process.pid,
                                                "address": p.address})
        if wait:
            self.wait_ready(timeout_s)

    def signal(self, node_id: int, sig: signal.Signals) -> None:
        """Send a signal to one process by PID (SIGKILL, SIGSTOP, SIGCONT, ...)."""
        p = self.process(node_id)
        if p.process is not None and p.process.poll() is None:
            p.process.send_signal(sig)
            log.info("kafka_broker_signalled", extra={"node_id": node_id, "signal": sig.name})
        if sig == signal.SIGKILL and p.process is not None:
            p.process.wait()
            self._close_log(p)

    def stop_broker(self, node_id: int, timeout_s: float = 30.0) -> None:
        """Stop one process: SIGTERM (a controlled shutdown), SIGKILL after `timeout_s`."""
        p = self.process(node_id)
        if p.process is None:
            return
        stop_process(p.process, timeout_s)
        self._close_log(p)
        log.info("kafka_broker_stopped", extra={"node_id": node_id, "pid": p.process.pid})

    @staticmethod
    def _close_log(p: KafkaProcess) -> None:
        if p._log is not None:
            p._log.close()
            p._log = None

    def admin(self) -> AdminClient:
        return AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0,
                            "socket.timeout.ms": 2000})

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait until every running process is a registered broker and the controller is known."""
        deadline = time.monotonic() + timeout_s
        want = {p.node_id for p in self.processes if p.running}
        admin = self.admin()
        seen: set[int] = set()
        while time.monotonic() < deadline:
            dead = [p for p in self.processes if p.process is not None and p.process.poll()
                    is not None and p.node_id in want]
            if dead:
                raise RuntimeError(f"Kafka node {dead[0].node_id} exited; see "
                                   f"{dead[0].folder / 'server.log'}")
            try:
                seen = set(admin.list_topics(timeout=2).brokers)
                cluster = admin.describe_cluster(request_timeout=2).result(timeout=3)
                if want <= seen and cluster.controller is not None:
                    return
            except Exception:  # not answering yet
                pass
            time.sleep(0.2)
        raise TimeoutError(f"Kafka brokers {sorted(want - seen)} did not register within "
                           f"{timeout_s:.0f} s; see {self.folder}")

    def wait_in_sync(self, timeout_s: float = 60.0) -> None:
        """Wait until every replica of every partition is in sync (after a broker came back)."""
        deadline = time.monotonic() + timeout_s
        admin = self.admin()
        behind: list[str] = []
        while time.monotonic() < deadline:
            try:
                meta = admin.list_topics(timeout=5)
            except Exception:  # a broker still starting
                time.sleep(0.5)
                continue
            behind = [f"{name}/{p.id}" for name, topic in meta.topics.items()
                      for p in topic.partitions.values() if len(p.isrs) < len(p.replicas)]
            if not behind:
                return
            time.sleep(0.5)
        raise TimeoutError(f"{len(behind)} partitions not in sync after {timeout_s:.0f} s, "
                           f"e.g. {behind[:3]}")

    def leader(self, topic: str, partition: int) -> int:
        """The node id leading a partition now."""
        meta = self.admin().list_topics(topic, timeout=10)
        return int(meta.topics[topic].partitions[partition].leader)

    def tool(self, main_class: str, *args: str, timeout_s: float = 300.0
             ) -> subprocess.CompletedProcess[str]:
        """Run one of Kafka's own tools (e.g. `org.apache.kafka.tools.ConsumerPerformance`)."""
        return subprocess.run([self._java or java("Kafka's tools"), "-Xmx512m", "-cp",
                               f"{self._libs if self.processes else fetch_jars(POM)}/*",
                               "-Dlog4j2.level=WARN", main_class, *args],
                              capture_output=True, text=True, timeout=timeout_s, check=False)

    def stop(self, kill: bool = False) -> None:
        """Stop every process by PID, then remove the data if the folder was temporary. `kill`
        skips the brokers' controlled shutdown (seconds), for data about to be removed."""
        # Signal all first, so the brokers shut down side by side; then wait for each.
        for p in self.processes:
            if kill:
                self.signal(p.node_id, signal.SIGKILL)
            elif p.running:
                self.signal(p.node_id, signal.SIGCONT)
                self.signal(p.node_id, signal.SIGTERM)
        for p in self.processes:
            self.stop_broker(p.node_id)
        if self._own_folder and self.processes:
            shutil.rmtree(self.folder, ignore_errors=True)
        log.info("kafka_cluster_stopped", extra={"folder": str(self.folder)})

    def __enter__(self) -> LocalKafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
