"""The outbox's SQL (schema.sql, shipped in the package) and `vqueues outbox install`."""

from __future__ import annotations

from importlib.resources import files
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

SCHEMA = "vqueues_outbox"
NOTIFY_CHANNEL = "vqueues_outbox"
# Advisory lock classes (the first key of the two-key form): a queue's transaction lock at
# insert, a bucket's session lock held by its relay, and the install's.
INSERT_LOCK_CLASS = 30321
BUCKET_LOCK_CLASS = 30322
INSTALL_LOCK_CLASS = 30323
BUCKETS = 64


def schema_sql() -> str:
    """The text of schema.sql."""
    return files("vqueues.outbox").joinpath("schema.sql").read_text(encoding="utf-8")


def install(conn: psycopg.Connection[Any]) -> str:
    """Apply schema.sql in one transaction (idempotent; concurrent installs wait for each
    other); return the database's namespace."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, 0)", (INSTALL_LOCK_CLASS,))
        conn.execute(schema_sql().encode())
        row = conn.execute(f"SELECT namespace FROM {SCHEMA}.meta").fetchone()
    assert row is not None
    return str(row[0])
