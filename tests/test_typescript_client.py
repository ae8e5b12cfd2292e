"""The TypeScript client (clients/typescript) through its own suite: `npm ci` from the committed
lockfile, then `npm test` (tsc strict, then node --test against `vqueues dev`: the embedded
broker and two real nodes, started and stopped by PID; and against a node started here that
serves HTTPS with a private CA and bearer tokens, for the client's auth and TLS options)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import NodeProcess, make_certificates
from vqueues.api.auth import token_hash

PACKAGE = Path(__file__).resolve().parents[1] / "clients" / "typescript"


def test_the_typescript_clients_suite_passes_against_real_nodes(topics, tmp_path):
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the TypeScript client's tests need Node 20")
    ca, cert, key = make_certificates(tmp_path)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": [
        {"name": "ts", "sha256": token_hash("ts-token"),
         "scopes": {"read": ["ts/"], "write": ["ts/"]}}]}))
    node = NodeProcess(topics, extra_env={"VQ_TLS_CERT": cert, "VQ_TLS_KEY": key,
                                          "VQ_AUTH": "true",
                                          "VQ_AUTH_TOKEN_FILE": str(tokens)}, ca_file=ca)
    node.start()
    try:
        env = {**os.environ, "VQ_PYTHON": sys.executable, "VQ_TS_TLS_URL": node.url,
               "VQ_TS_CA": ca, "VQ_TS_TOKEN": "ts-token"}
        ci = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PACKAGE, env=env,
                            capture_output=True, text=True, timeout=600)
        assert ci.returncode == 0, ci.stdout + ci.stderr
        run = subprocess.run(["npm", "test"], cwd=PACKAGE, env=env, capture_output=True,
                             text=True, timeout=900)
    finally:
        node.terminate()
    print(run.stdout[-3000:])
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert "# fail 0" in run.stdout and "# skipped 0" in run.stdout
