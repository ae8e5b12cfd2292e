"""The local Kafka cluster's storage tool, run for real: the formatting step every Kafka test
stands on (the whole cluster starts in `conftest.kafka_cluster`)."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from vqueues.kafka.local_cluster import POM, format_arguments
from vqueues.kafka.maven import JarsUnavailable, fetch_jars, java


def test_an_id_that_starts_with_a_dash_formats_a_node(tmp_path):
    """One id in 64 starts with "-"; argparse read it as an option and a CI run failed."""
    try:
        binary, libs = java("the storage tool"), fetch_jars(POM)
    except JarsUnavailable as exc:
        pytest.skip(f"needs real Apache Kafka: {exc}")
    config = tmp_path / "server.properties"
    config.write_text("\n".join([
        "node.id=1", "process.roles=broker,controller",
        "controller.quorum.voters=1@127.0.0.1:9999", "controller.listener.names=CONTROLLER",
        "listeners=PLAINTEXT://127.0.0.1:9998,CONTROLLER://127.0.0.1:9999",
        f"log.dirs={tmp_path / 'data'}", ""]))
    cid = "-" + "A" * 21
    done = subprocess.run([binary, "-cp", f"{libs}/*", "kafka.tools.StorageTool",
                           *format_arguments(cid, config)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"cluster.id={cid}" in (tmp_path / "data" / "meta.properties").read_text()


def test_vqueues_kafka_stops_every_broker_when_one_exits(tmp_path):
    """docs/kafka.md: the command runs the cluster as a whole; a broker that exits stops it."""
    try:
        java("the local Kafka cluster")
        fetch_jars(POM)
    except JarsUnavailable as exc:
        pytest.skip(f"needs real Apache Kafka: {exc}")
    with subprocess.Popen([sys.executable, "-m", "vqueues", "kafka", "--brokers", "2",
                           "--folder", str(tmp_path)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as cmd:
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.extend(cmd.stderr or ()), daemon=True)
        reader.start()
        pids: list[int] = []
        try:
            banner = [next(cmd.stdout or iter(())) for _ in range(3)]
            assert "Press Ctrl-C to stop." in banner[-1], banner
            pids = [int(m) for line in list(err)
                    for m in re.findall(r"kafka_broker_started .*pid=(\d+)", line)]
            assert len(pids) == 2, err
            os.kill(pids[0], signal.SIGKILL)
            assert cmd.wait(90) == 1
            reader.join(10)
            assert "vqueues: a Kafka process exited; stopping" in "".join(err)
            for pid in pids:  # both gone: the other broker was stopped, not left running
                with pytest.raises(ProcessLookupError):
                    os.kill(pid, 0)
        finally:
            if cmd.poll() is None:
                cmd.send_signal(signal.SIGTERM)
                cmd.wait(60)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
