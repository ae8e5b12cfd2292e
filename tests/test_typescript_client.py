"""The TypeScript client (clients/typescript) through its own suite: `npm ci` from the committed
lockfile, then `npm test` (tsc strict, then node --test against `vqueues dev`: the embedded
broker and two real nodes, started and stopped by PID)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "clients" / "typescript"


def test_the_typescript_clients_suite_passes_against_real_nodes():
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the TypeScript client's tests need Node 20")
    env = {**os.environ, "VQ_PYTHON": sys.executable}
    ci = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PACKAGE, env=env,
                        capture_output=True, text=True, timeout=600)
    assert ci.returncode == 0, ci.stdout + ci.stderr
    run = subprocess.run(["npm", "test"], cwd=PACKAGE, env=env, capture_output=True, text=True,
                         timeout=900)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "# fail 0" in run.stdout and "# pass " in run.stdout
