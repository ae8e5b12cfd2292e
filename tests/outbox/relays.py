"""Plain helpers of the outbox's tests: a relay process, a queue's records, the rows left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from vqueues_client import AsyncClient, Record, VQError

from tests.support import LOGS

# A crash test waits settle_ms after a relay died before its queues are read back: small here
# (a loopback node answers in milliseconds), with the deadline below it.
FAST = ["--poll-ms", "200", "--deadline-ms", "1500", "--settle-ms", "2500",
        "--backoff-max-ms", "500"]


@dataclass
class RelayProcess:
    """`python -m vqueues outbox relay` in its own process, stopped by PID."""

    dsn: str
    url: str
    extra: list[str] = field(default_factory=list)
    name: str = field(default_factory=lambda: f"relay-{uuid.uuid4().hex[:6]}")
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self):
        return LOGS / f"{self.name}.log"

    def start(self) -> RelayProcess:
        LOGS.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vqueues", "outbox", "relay", "--dsn", self.dsn,
             "--url", self.url, *FAST, *self.extra],
            stdout=log, stderr=subprocess.STDOUT, env=os.environ.copy())
        log.close()
        return self

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def stop(self) -> int:
        return self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait()
        rc = self.process.returncode
        self.process = None
        return rc

    def events(self, name: str) -> list[str]:
        return [line for line in self.log_path.read_text().splitlines()
                if f'"event": "{name}"' in line]


def scalar(dsn: str, sql: str, params: Any = None) -> Any:
    """The first column of the first row `sql` answers."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def pending(dsn: str) -> int:
    return int(scalar(dsn, "SELECT count(*) FROM vqueues_outbox.records"))


async def queue_records(url: str, queue: str) -> list[Record]:
    """Every record of `queue` (from offset 0)."""
    out: list[Record] = []
    async with AsyncClient(url) as vq:
        offset = 0
        while True:
            try:
                page = await vq.read(queue, offset=offset, limit=1000)
            except VQError as exc:
                if exc.code == "queue_not_found":
                    return out
                raise
            if not page.records:
                return out
            out.extend(page.records)
            offset = page.next_offset


def wait_until(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
