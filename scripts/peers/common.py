"""What every system in scripts/bench_peers.py shares: the workloads' sizes, the server
processes (started fresh, stopped by PID), their CPU and memory, and the result of a run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vqueues.kafka.broker import free_port  # noqa: F401 - the peers' one free port

VALUE = b"x" * 100  # every record: 100 bytes
SPAWNED: list[int] = []  # every server process started, for the report (and the smoke test)
CLK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class Sizes:
    """The workloads' sizes: the issue's by default, tiny for the smoke test."""
    seconds: float = 5.0            # each enqueue-throughput run
    producers: int = 16
    batch: int = 100
    few_queues: int = 10
    many_queues: int = 100_000      # enqueue over many queues, small writes, memory, restart
    small_cap_s: float = 60.0       # one-record calls stop here (the rest go in batches)
    samples: int = 2_000            # end to end
    work_records: int = 200_000
    work_queues: int = 10
    workers: int = 16
    per_call: tuple[int, ...] = (10, 100)
    restart_cap_s: float = 300.0    # a restart not ready by then is reported so


def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree(roots: list[int]) -> list[int]:
    """`roots` and every process below them (RabbitMQ's beam under its start script)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(int(st[1]), []).append(int(entry))
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def cpu_seconds(roots: list[int]) -> float:
    """User + system CPU seconds of these processes and everything below them, so far."""
    total = 0.0
    for pid in tree(roots):
        exact = process_cpu(pid)
        if exact is not None:
            total += exact
        elif (st := _stat(pid)) is not None:
            total += (int(st[11]) + int(st[12])) / CLK
    return total


def process_cpu(pid: int) -> float | None:
    """Another process's CPU seconds so far (every thread, ended ones too) from Linux's
    per-process CPU-time clock, in nanoseconds; /proc's stat counts 10 ms clock ticks, and a
    smoke run's 20 ms workload could count none (the id is the one clock_getcpuclockid(3)
    makes: the process's CPUCLOCK_SCHED). None where the clock cannot be read."""
    try:
        return time.clock_gettime(((~pid) << 3) | 2)
    except OSError:
        return None


def rss_bytes(roots: list[int]) -> int:
    total = 0
    for pid in tree(roots):
        with contextlib.suppress(OSError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    return total


def client_cpu() -> float:
    """This process's CPU seconds (all its threads) plus its finished children's (Kafka's
    own perf tools run as children)."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


class Server:
    """One server process, in a session of its own so that what it spawns is found too."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None = None,
                 log: Path | None = None, cwd: Path | None = None) -> None:
        self.name = name
        self.argv = argv
        self.env = {**os.environ, **(env or {})}
        self.log = log
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> Server:
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            cwd=self.cwd)
            SPAWNED.append(self.process.pid)
        finally:
            if self.log:
                out.close()  # type: ignore[union-attr]
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM to the process and all it spawned (its session), SIGKILL after the timeout."""
        if self.process is None:
            return
        pids = tree([self.process.pid])
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout_s)
        deadline = time.monotonic() + 5
        for pid in pids:  # the children it left behind, by PID
            while _stat(pid) is not None and time.monotonic() < deadline:
                time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.process = None


async def wait_for(check: Callable[[], Awaitable[bool]], timeout_s: float, what: str,
                   pause_s: float = 0.02) -> float:
    """Poll `check` until it holds; the time it took."""
    t0 = time.perf_counter()
    while True:
        try:
            if await check():
                return time.perf_counter() - t0
        except Exception:
            pass
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"{what}: not within {timeout_s:.0f} s")
        await asyncio.sleep(pause_s)


def scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"vq-peers-{prefix}-"))


def wipe(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def pct(samples: list[float], p: float) -> float:
    """The p-quantile of seconds, in milliseconds (nearest rank)."""
    s = sorted(samples)
    return s[min(len(s) - 1, max(0, int(len(s) * p + 0.999999) - 1))] * 1000


@dataclass
class Figure:
    """One measured figure: the rate or latencies, with the CPU both sides spent on it."""
    value: float | None = None          # records/s, bytes per queue, seconds
    unit: str = ""
    extra: dict[str, Any] = field(default_factory=dict)  # p50/p99/p99.9, calls/s, notes
    server_cpu_s: float = 0.0
    client_cpu_s: float = 0.0
    wall_s: float = 0.0
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, **self.extra,
                "server_cpu_s": round(self.server_cpu_s, 3),
                "client_cpu_s": round(self.client_cpu_s, 3), "wall_s": round(self.wall_s, 3),
                **({"note": self.note} if self.note else {})}


class Meter:
    """`async with Meter(pids) as m: ...`: wall time and both sides' CPU over the block."""

    def __init__(self, server_pids: Callable[[], list[int]]) -> None:
        self.server_pids = server_pids
        self.figure = Figure()

    async def __aenter__(self) -> Meter:
        self._s0 = cpu_seconds(self.server_pids())
        self._c0 = client_cpu()
        self._t0 = time.perf_counter()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.figure.wall_s = time.perf_counter() - self._t0
        self.figure.server_cpu_s = cpu_seconds(self.server_pids()) - self._s0
        self.figure.client_cpu_s = client_cpu() - self._c0

    def rate(self, records: int, calls: int | None = None) -> Figure:
        f = self.figure
        f.value, f.unit = records / max(f.wall_s, 1e-9), "records/s"
        f.extra["records"] = records
        if calls is not None:
            f.extra["calls_per_s"] = round(calls / max(f.wall_s, 1e-9), 1)
        # Too short a time to say what a record costs.
        if records and f.server_cpu_s >= 0.1:
            f.extra["records_per_server_cpu_s"] = round(records / f.server_cpu_s)
        return f


def latencies(samples: list[float], fig: Figure) -> Figure:
    fig.value, fig.unit = pct(samples, 0.5), "ms"
    fig.extra.update({"p50_ms": round(pct(samples, 0.5), 3), "p99_ms": round(pct(samples, 0.99), 3),
                      "p999_ms": round(pct(samples, 0.999), 3), "samples": len(samples)})
    return fig


def split(names: list[str], parts: int) -> list[list[str]]:
    return [names[i::parts] for i in range(parts)]
