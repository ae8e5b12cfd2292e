"""`vqueues dev` (what scripts/run starts): prints curl lines that work as printed, stops on
Ctrl-C with everything it started."""

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.narrow import known
from tests.support import FAST_GROUP
from vqueues.kafka.broker import free_port


def two_free_ports() -> int:
    """A port P with P + 1 free too: `--nodes 2` listens on both."""
    for _ in range(100):
        port = free_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


@pytest.mark.skipif(subprocess.run(["which", "curl"], capture_output=True).returncode != 0,
                    reason="curl is not installed on this machine")
def test_dev_prints_working_curl_lines_and_stops_cleanly_on_ctrl_c(tmp_path):
    port = two_free_ports()
    # Its logs go to a file, so that a failure says why (it once exited early in a full run).
    stderr = open(tmp_path / "dev.log", "w")  # noqa: SIM115 (closed in finally)
    proc = subprocess.Popen(
        [sys.executable, "-m", "vqueues", "dev", "--nodes", "2", "--partitions", "4",
         "--http-port", str(port)], stdout=subprocess.PIPE, stderr=stderr,
        text=True, env={**os.environ, **FAST_GROUP}, start_new_session=True)
    try:
        lines = []
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = known(proc.stdout).readline()
            assert line, ("vqueues dev exited before printing its banner; its log ends:\n"
                          + (tmp_path / "dev.log").read_text()[-3000:])
            lines.append(line.rstrip("\n"))
            if line.startswith("Press Ctrl-C"):
                break
        curls = [ln.strip() for ln in lines if ln.strip().startswith("curl ")]
        assert len(curls) >= 4
        outputs = []
        for cmd in curls:
            out = subprocess.run([*shlex.split(cmd), "-w", "\n%{http_code}"],
                                 capture_output=True, text=True, timeout=30)
            body, code = out.stdout.rsplit("\n", 1)
            assert code == "200", (cmd, body)
            outputs.append(body)
        assert '"value":"hello"' in outputs[1]
        assert '"consumer":"me"' in outputs[3]
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(60)
        known(proc.stdout).close()
        stderr.close()
    assert rc == 0
    # Every process it started is gone (same session, started by it).
    left = subprocess.run(["pgrep", "-s", str(proc.pid)], capture_output=True, text=True)
    assert left.stdout.strip() == ""


def test_vqueues_kafka_and_dev_kafka_exit_3_with_the_reason_where_java_is_missing(tmp_path):
    """Without Java the Kafka options say so and change nothing: no folder, no process."""
    env = {"PATH": str(Path(sys.executable).parent), "JAVA_HOME": str(tmp_path / "no-jdk"),
           "VQ_KAFKA_CACHE": str(tmp_path)}
    for args in (["kafka"], ["dev", "--kafka"]):
        run = subprocess.run([sys.executable, "-m", "vqueues", *args], env=env,
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 3, run.stderr
        assert "needs Java 17+" in run.stderr
    assert list(tmp_path.iterdir()) == []
