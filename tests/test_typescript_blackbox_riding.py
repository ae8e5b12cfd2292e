"""The TypeScript client's completions riding on leases, checked black-box from its README and
docs/work-queues.md (clients/typescript/test/blackbox-riding.bb.ts, named so that `npm test`
does not run it too): `npm ci`, `tsc` (strict, the whole package), then that one file under
`node --test` against a node started here on the module's broker, stopped by PID."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import NodeProcess, Topics

PACKAGE = Path(__file__).resolve().parents[1] / "clients" / "typescript"


def test_typescript_riding_completions_keep_the_documented_promises(node: NodeProcess,
                                                                     topics: Topics) -> None:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the TypeScript client's tests need Node 20")
    env = {**os.environ, "VQ_PYTHON": sys.executable, "VQ_TS_BB_URL": node.url}
    ci = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PACKAGE, env=env,
                        capture_output=True, text=True, timeout=600)
    assert ci.returncode == 0, ci.stdout + ci.stderr
    build = subprocess.run(["npm", "run", "build"], cwd=PACKAGE, env=env, capture_output=True,
                           text=True, timeout=600)
    assert build.returncode == 0, build.stdout + build.stderr
    run = subprocess.run(["node", "--test", "--test-concurrency=1",
                          "dist/test/blackbox-riding.bb.js"], cwd=PACKAGE, env=env,
                         capture_output=True, text=True, timeout=300)
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "# fail 0" in run.stdout and "# skipped 0" in run.stdout
    assert "# pass 0" not in run.stdout
