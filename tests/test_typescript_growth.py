"""The TypeScript client through a growth (ADR 19, docs/growing.md): one client process
(tests/ts_growth/load.mjs, the built clients/typescript) writes and reads with a named consumer
while `vqueues topics grow` takes two real nodes on the default broker from 4 partitions to 8;
it follows the new partition count without a restart and loses, repeats and reorders nothing."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support import create_topics, http, start_cluster
from tests.test_growth import grow, wait_layout
from vqueues.hashing import partition_for
from vqueues.layouts import layout_of

PACKAGE = Path(__file__).resolve().parents[1] / "clients" / "typescript"
SCRIPT = Path(__file__).resolve().parent / "ts_growth" / "load.mjs"


def build_client() -> Path:
    """The client built from this tree (`npm ci` once, then `npm run build`): its index.js."""
    if not (PACKAGE / "node_modules" / "typescript").is_dir():
        ci = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PACKAGE,
                            capture_output=True, text=True, timeout=600)
        assert ci.returncode == 0, ci.stdout + ci.stderr
    build = subprocess.run(["npm", "run", "build"], cwd=PACKAGE, capture_output=True, text=True,
                           timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    return PACKAGE / "dist" / "src" / "index.js"


def queue_names(count: int) -> list[str]:
    """`count` queues, half of them moving to a new partition at the growth, half staying."""
    moving: list[str] = []
    staying: list[str] = []
    run = uuid.uuid4().hex[:6]
    i = 0
    while len(moving) < count // 2 or len(staying) < count - count // 2:
        q = f"tg-{run}-{i}"
        i += 1
        (moving if partition_for(q, 8) != partition_for(q, 4) else staying).append(q)
    return moving[:count // 2] + staying[:count - count // 2]


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no line from the client within {timeout_s}s"
    return proc.stdout.readline()


def test_one_typescript_client_follows_a_growth_without_a_restart(bootstrap: str,
                                                                  tmp_path: Path) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the TypeScript client needs Node 20")
    index = build_client()
    queues = queue_names(10)
    t = create_topics(bootstrap, partitions=4)
    nodes = start_cluster(t, 2)
    stderr = tmp_path / "client.stderr"
    proc: subprocess.Popen[str] | None = None
    try:
        with stderr.open("w") as err:
            proc = subprocess.Popen(["node", str(SCRIPT), str(index), *(n.url for n in nodes)],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                    text=True, env={**os.environ, "VQ_QUEUES": ",".join(queues)})
        assert json.loads(read_line(proc, 60)) == {"ready": True}, stderr.read_text()
        time.sleep(1.0)
        grow(t, 8)
        wait_layout(nodes, 1, 8, 60)
        time.sleep(3.0)  # the client goes on writing and reading on the new layout
        assert proc.stdin is not None
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        out, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, out[-3000:] + stderr.read_text()[-5000:]
        _, cmap = http("GET", f"{nodes[0].url}/v1/partitions")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        for n in nodes:
            n.terminate()
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    met: dict[str, int] = result["met"]
    print("the client met", met)
    # It went through the growth's pause: a partition cut or replaying, a node restarting.
    assert any(k.startswith("503") or not k[0].isdigit() for k in met), met
    assert cmap["partitions"] == 8 and cmap["layout"] == 1
    for q in queues:
        s = result["queues"][q]
        assert s["seen"] == s["acked"], q  # every acknowledged record once, in order
        layouts = [layout_of(offset) for _, _, offset in s["answers"]]
        assert 0 in layouts and 1 in layouts, q  # written before the growth and after it
        for _, partition, offset in s["answers"]:
            assert partition == partition_for(q, 8 if layout_of(offset) else 4), q
    # The client routes with the new count: its map has 8 partitions, every owner it names is
    # the cluster's (a map fetched while a node still learned the others' partitions lacks
    # theirs: the client sends those queues to its first URL, and a 409 wrong_node corrects
    # it), and every queue goes to the node that owns the queue's partition among 8.
    assert result["partitions"] == 8
    owners = {int(p): o["url"] for p, o in cmap["owners"].items()}
    assert sorted(owners) == list(range(8))
    assert all(owners[int(p)] == url for p, url in result["owners"].items()), result["owners"]
    assert result["routed"] == {q: owners[partition_for(q, 8)] for q in queues}
