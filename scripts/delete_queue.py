#!/usr/bin/env python3
"""Delete vqueues queues through the nodes that own them: `vqueues queues delete`.

Usage: scripts/delete_queue.py --url http://node:8080 [--yes] [--dry-run] QUEUE [QUEUE ...]

A thin wrapper kept for the users who know it; every flag of `vqueues queues delete --help`
works (--prefix, --token, --ca-file, --json, ...). The cluster map comes from any node given
with --url (or VQ_URL); each queue is deleted on the node that owns its partition. Each queue's
record count and consumers are shown first, and the deletion is confirmed unless --yes. Exit
status: 0 when every queue was deleted (or, with --dry-run, would be), 1 when any deletion
failed or a queue was not found (unless --ignore-missing), 2 for bad usage.
"""

from __future__ import annotations

import sys

from vqueues.cli import main as vqueues_main


def main(argv: list[str] | None = None) -> int:
    return vqueues_main(["queues", "delete", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
