"""The outbox's fixtures: one PostgreSQL server per session (tests/postgres.py), a database
with the outbox installed per module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.postgres import SKIP_REASON, PostgresServer, server_bin


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    bin_dir = server_bin()
    if bin_dir is None:
        pytest.skip(SKIP_REASON)
    server = PostgresServer(bin_dir).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def outbox_dsn(postgres: PostgresServer) -> str:
    """A new database with the outbox installed (by the library call the command makes)."""
    import psycopg

    from vqueues.outbox.schema import install

    dsn = postgres.create_database(f"db_{uuid.uuid4().hex[:10]}")
    with psycopg.connect(dsn) as conn:
        install(conn)
    return dsn
