"""scripts/bench_peers.py itself, at tiny sizes and with vqueues alone (the comparison is a
benchmark, not a test): it starts the embedded broker and a node, runs every workload, restarts
the node, stops everything it started, and writes its tables, figures and charts."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKLOADS = ["enqueue_few", "e2e", "work_10", "work_worker", "small_one", "small_batched",
             "memory", "restart", "enqueue_many"]


def test_the_comparison_script_runs_every_workload_on_vqueues(tmp_path):
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_peers.py"), "--smoke", "--systems",
         "vqueues", "--report", str(tmp_path)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    report = json.loads((tmp_path / "results.json").read_text())
    figures = report["systems"]["vqueues"]["figures"]
    assert sorted(figures) == sorted(WORKLOADS)
    for key in ("enqueue_few", "enqueue_many", "work_10", "work_worker", "small_one",
                "small_batched"):
        assert figures[key]["value"] > 0, (key, figures[key])
        assert figures[key]["server_cpu_s"] > 0, (key, figures[key])
    # Every record of the work queue was drained, and each small write reached its queue.
    assert figures["work_10"]["records"] == 400
    assert figures["work_worker"]["records"] == 400
    assert figures["small_batched"]["records"] == 300
    e2e = figures["e2e"]
    assert e2e["samples"] == 20 and 0 < e2e["p50_ms"] <= e2e["p99_ms"] <= e2e["p999_ms"]
    restart = figures["restart"]
    assert 0 < restart["first_read_s"] <= restart["all_ready_s"]
    assert figures["memory"]["rss_after_mb"] > 0
    tables = (tmp_path / "tables.md").read_text()
    assert "### Work queue: 200,000 records" not in tables  # the smoke sizes are named as run
    assert "| vqueues (embedded broker) |" in tables
    assert tables in run.stdout
    for chart in ("enqueue", "small_writes", "end_to_end", "work_queue", "memory", "restart"):
        png = tmp_path / f"{chart}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", chart
    # Nothing it started is left running: a broker and a node per phase, and the node again
    # for the restart.
    assert len(report["spawned_pids"]) == 5
    for pid in report["spawned_pids"]:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} was left running"


def test_a_system_that_is_not_installed_is_skipped_with_a_line_saying_so(tmp_path):
    env = {**os.environ, "PATH": "/nonexistent"}
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_peers.py"), "--smoke", "--systems",
         "redis,nats,rabbitmq", "--report", str(tmp_path), "--no-charts"],
        capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "redis: skipped: redis-server is not installed" in run.stdout
    assert "nats: skipped: nats-server is not installed" in run.stdout
    assert "rabbitmq: skipped: rabbitmq-server is not installed" in run.stdout
    report = json.loads((tmp_path / "results.json").read_text())
    assert set(report["systems"]) == {"redis", "nats", "rabbitmq"}
    assert all("skipped" in v for v in report["systems"].values())
