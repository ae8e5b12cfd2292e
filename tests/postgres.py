"""A PostgreSQL server for the outbox's tests: Debian's binaries, a temporary folder, a free
loopback port, the socket in the folder; stopped by PID. `initdb` and `postgres` refuse to run
as root, so as root they run as `nobody`."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vqueues.kafka.broker import free_port

SKIP_REASON = ("PostgreSQL's server binaries (initdb, postgres) are not installed: install "
               "Debian's postgresql package (.ci/run does, when it runs as root)")


def server_bin() -> Path | None:
    """The folder of initdb and postgres: on PATH, or Debian's newest /usr/lib/postgresql."""
    found = shutil.which("initdb")
    if found and shutil.which("postgres"):
        return Path(found).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                      key=lambda p: int(Path(p).parent.parent.name))
    return Path(versions[-1]).parent if versions else None


def _as_user() -> dict[str, Any]:
    """Popen arguments that drop root to `nobody`; none when not root."""
    if os.geteuid() != 0:
        return {}
    nobody = pwd.getpwnam("nobody")
    return {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}


@dataclass
class PostgresServer:
    bin_dir: Path
    folder: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="vq-pg-")))
    port: int = 0
    process: subprocess.Popen[bytes] | None = None

    def dsn(self, dbname: str = "postgres") -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def start(self, timeout_s: float = 60.0) -> PostgresServer:
        import psycopg

        user = _as_user()
        if user:
            os.chown(self.folder, user["user"], user["group"])
        data, sockets = self.folder / "data", self.folder / "sockets"
        subprocess.run([str(self.bin_dir / "initdb"), "-D", str(data), "-U", "postgres",
                        "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"],
                       check=True, capture_output=True, **user)
        subprocess.run(["mkdir", str(sockets)], check=True, **user)
        self.port = free_port()
        log = open(self.folder / "postgres.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [str(self.bin_dir / "postgres"), "-D", str(data), "-p", str(self.port),
             "-k", str(sockets), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
             "-c", "max_connections=200"],
            stdout=log, stderr=subprocess.STDOUT, **user)
        log.close()
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"postgres exited: {self.log_tail()}")
            try:
                psycopg.connect(self.dsn(), connect_timeout=2).close()
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def log_tail(self) -> str:
        path = self.folder / "postgres.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.dsn(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"'.encode())
        return self.dsn(name)

    def stop(self) -> None:
        """Fast shutdown (SIGINT) by PID, then SIGKILL if it lingers; remove the folder."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
        shutil.rmtree(self.folder, ignore_errors=True)
