"""Write records to the transactional outbox inside your own database transaction
(docs/outbox.md): `vqueues outbox relay` moves each committed row to its queue, once.

`add(conn, queue, value, ...)` takes a psycopg 3 connection (the `psycopg` extra) or a
SQLAlchemy `Session` or `Connection` on PostgreSQL; `add_async` takes a psycopg
`AsyncConnection`. A record the node
would refuse (a bad queue name, header, tag or key, a value over `max_record_bytes`) raises
`VQError` before anything is written, so it fails your transaction instead of reaching the
relay."""

from __future__ import annotations

import json
import re
from typing import Any

from vqueues_client.encoding import name_error
from vqueues_client.errors import VQError
from vqueues_client.transport import DEFAULT_MAX_RECORD_BYTES
from vqueues_client.types import Value

TABLE = "vqueues_outbox.records"
OUTBOX_ID_HEADER = "vq-outbox-id"
MAX_TAGS = 8
MAX_TAG_BYTES = 64
MAX_KEY_BYTES = 256
# The node's tag rule (vqueues/state/tags.py): no comma, no surrounding space (str.isspace).
_SPACE = ("\\t\\n\\v\\f\\r \\x1c-\\x1f\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029"
          "\\u202f\\u205f\\u3000")
_TAG = re.compile(f"^[^,{_SPACE}](?:[^,]*[^,{_SPACE}])?$")

_NOW_MS = "(extract(epoch from clock_timestamp()) * 1000)::bigint"
_INSERT = (f"INSERT INTO {TABLE} (queue, value, headers, ordering_key, tags, idempotency_key, "
           f"deliver_at) VALUES (%s, %s, %s::jsonb, %s, %s::text[], %s, {{due}}) RETURNING id")


def _bad(message: str, code: str = "invalid_record", status: int = 400) -> VQError:
    return VQError(status, code, message)


def _check_tags(tags: list[str]) -> None:
    if not isinstance(tags, list) or len(tags) > MAX_TAGS:
        raise _bad(f"tags must be a list of at most {MAX_TAGS} strings")
    for tag in tags:
        if not isinstance(tag, str) or not _TAG.fullmatch(tag):
            raise _bad(f"tag {tag!r}: a tag is a non-empty string without commas or "
                       "surrounding spaces")
        if len(tag.encode("utf-8")) > MAX_TAG_BYTES:
            raise _bad(f"tag {tag!r} is over {MAX_TAG_BYTES} UTF-8 bytes")


def _check_headers(headers: dict[str, str] | None) -> None:
    for k, v in (headers or {}).items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise _bad("headers must map strings to strings")
    if OUTBOX_ID_HEADER in (headers or {}):
        raise _bad(f"the header {OUTBOX_ID_HEADER} is the relay's own")


def check(queue: str, value: Value, *, headers: dict[str, str] | None = None,
          ordering_key: str | None = None, tags: list[str] | None = None,
          delay_ms: int | None = None, deliver_at: int | None = None,
          idempotency_key: str | None = None,
          max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> None:
    """Raise the `VQError` the node would answer for this record (or one of the outbox's own
    rules); return None if it is valid."""
    bad_name = name_error(queue)
    if bad_name is not None:
        raise bad_name
    if value is not None and not isinstance(value, bytes | str):
        raise _bad(f"value must be bytes, str or None, not {type(value).__name__}")
    size = len(value.encode("utf-8")) if isinstance(value, str) else len(value or b"")
    if size > max_record_bytes:
        raise _bad(f"value is {size} bytes; at most {max_record_bytes} (max_record_bytes)",
                   "record_too_large", 413)
    _check_headers(headers)
    if ordering_key is not None and (not isinstance(ordering_key, str) or not ordering_key):
        raise _bad("ordering_key must be a non-empty string")
    if tags is not None:
        _check_tags(tags)
    if idempotency_key is not None and (
            not isinstance(idempotency_key, str)
            or not 1 <= len(idempotency_key.encode("utf-8")) <= MAX_KEY_BYTES):
        raise _bad(f"idempotency_key must be a string of 1-{MAX_KEY_BYTES} UTF-8 bytes")
    if delay_ms is not None and deliver_at is not None:
        raise _bad("give delay_ms or deliver_at, not both")
    for name, given in (("delay_ms", delay_ms), ("deliver_at", deliver_at)):
        if given is not None and (isinstance(given, bool) or not isinstance(given, int)
                                  or given < 0):
            raise _bad(f"{name} must be an integer of 0 or more", "limit_out_of_range")


def _statement(queue: str, value: Value, headers: dict[str, str] | None,
               ordering_key: str | None, tags: list[str] | None, delay_ms: int | None,
               deliver_at: int | None, idempotency_key: str | None
               ) -> tuple[str, tuple[Any, ...]]:
    data = value.encode("utf-8") if isinstance(value, str) else value
    params: tuple[Any, ...] = (queue, data, json.dumps(headers or {}), ordering_key, tags,
                               idempotency_key)
    if delay_ms is not None:  # the database's clock: the relay compares due times with it
        return _INSERT.format(due=f"{_NOW_MS} + %s"), (*params, delay_ms)
    return _INSERT.format(due="%s"), (*params, deliver_at)


def add(conn: Any, queue: str, value: Value, *, headers: dict[str, str] | None = None,
        ordering_key: str | None = None, tags: list[str] | None = None,
        delay_ms: int | None = None, deliver_at: int | None = None,
        idempotency_key: str | None = None,
        max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> int:
    """Add a record for `queue` to the outbox in `conn`'s current transaction; return its row
    id. It reaches the queue once the transaction commits, never if it rolls back. `delay_ms`
    (or `deliver_at`, UTC epoch ms) holds it in the outbox until then (by the database's
    clock). `idempotency_key` is sent as the record's key: another row with the same key
    within the node's window is not stored again."""
    check(queue, value, headers=headers, ordering_key=ordering_key, tags=tags,
          delay_ms=delay_ms, deliver_at=deliver_at, idempotency_key=idempotency_key,
          max_record_bytes=max_record_bytes)
    sql, params = _statement(queue, value, headers, ordering_key, tags, delay_ms, deliver_at,
                             idempotency_key)
    if callable(getattr(conn, "exec_driver_sql", None)):  # a SQLAlchemy Connection
        row = conn.exec_driver_sql(sql, params).fetchone()
    elif type(conn).__module__.startswith("sqlalchemy") and callable(
            getattr(conn, "connection", None)):  # a SQLAlchemy Session
        row = conn.connection().exec_driver_sql(sql, params).fetchone()
    else:  # psycopg 3, psycopg 2 or another DB-API connection with %s parameters
        cur = conn.cursor()
        try:
            cur.execute(sql, params)
            row = cur.fetchone()
        finally:
            cur.close()
    return int(row[0])


async def add_async(conn: Any, queue: str, value: Value, *,
                    headers: dict[str, str] | None = None, ordering_key: str | None = None,
                    tags: list[str] | None = None, delay_ms: int | None = None,
                    deliver_at: int | None = None, idempotency_key: str | None = None,
                    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES) -> int:
    """`add` for a psycopg `AsyncConnection`."""
    check(queue, value, headers=headers, ordering_key=ordering_key, tags=tags,
          delay_ms=delay_ms, deliver_at=deliver_at, idempotency_key=idempotency_key,
          max_record_bytes=max_record_bytes)
    sql, params = _statement(queue, value, headers, ordering_key, tags, delay_ms, deliver_at,
                             idempotency_key)
    cur = await conn.execute(sql, params)
    row = await cur.fetchone()
    return int(row[0])
