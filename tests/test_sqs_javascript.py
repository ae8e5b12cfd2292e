"""The AWS SDK for JavaScript v3 (`@aws-sdk/client-sqs`, which checks the messages' MD5s)
through the full SQS cycle against a real node: tests/sqs_sdk_js/cycle.mjs, its package
installed with `npm ci` from the committed lockfile (docs/sqs.md)."""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent / "sqs_sdk_js"


def test_the_javascript_sdk_runs_the_full_cycle(node):
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the AWS SDK for JavaScript needs Node 20")
    ci = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=PACKAGE,
                        capture_output=True, text=True, timeout=600)
    assert ci.returncode == 0, ci.stdout + ci.stderr
    run = subprocess.run(["node", "cycle.mjs"], cwd=PACKAGE, capture_output=True, text=True,
                         timeout=300, env={**os.environ, "SQS_ENDPOINT": node.url})
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result == {"ok": True, "steps": [
        "create", "send", "batch send", "long-poll receive", "change visibility", "redrive",
        "fifo groups and deduplication", "errors"]}
