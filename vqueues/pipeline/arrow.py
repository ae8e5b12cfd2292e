"""Kafka messages to Arrow record batches in the source's schema (faster than tuples)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa

HEADER = pa.struct([("key", pa.string()), ("value", pa.binary())])
ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
    ("partition", pa.int32()), ("offset", pa.int64()),
    ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(HEADER)), ("queue", pa.string()),
])


def _queues(keys: pa.Array) -> pa.Array:
    """Keys as UTF-8 strings; a key that is not valid UTF-8 (or absent) gives null."""
    try:
        return keys.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        out = []
        for k in keys.to_pylist():
            try:
                out.append(None if k is None else k.decode("utf-8"))
            except UnicodeDecodeError:
                out.append(None)
        return pa.array(out, pa.string())


ARROW_SCHEMA_BUCKETED = ARROW_SCHEMA.append(pa.field("bucket", pa.int32()))


def with_bucket(batch: pa.RecordBatch, buckets: int) -> pa.RecordBatch:
    """`batch` plus the archive bucket of each record's queue (vqueues/pipeline/layout.py),
    hashed once per distinct queue of the batch."""
    import pyarrow.compute as pc

    from vqueues.pipeline.layout import archive_buckets

    queues = batch.column("queue")
    distinct = pc.unique(queues)
    of_distinct = pa.array(archive_buckets(distinct.to_pylist(), buckets), pa.int32())
    column = pc.take(of_distinct, pc.index_in(queues, value_set=distinct))
    return pa.RecordBatch.from_arrays([*batch.columns, column], schema=ARROW_SCHEMA_BUCKETED)


def to_record_batch(msgs: Sequence[Any]) -> pa.RecordBatch:
    """Messages of one partition (as `read_range` yields them) as one record batch."""
    n = len(msgs)
    first = msgs[0]
    keys = pa.array([m.key() for m in msgs], pa.binary())
    stamps = [m.timestamp() for m in msgs]
    return pa.RecordBatch.from_arrays([
        keys,
        pa.array([m.value() for m in msgs], pa.binary()),
        pa.array([first.topic()] * n, pa.string()),
        pa.array([first.partition()] * n, pa.int32()),
        pa.array([m.offset() for m in msgs], pa.int64()),
        pa.array([ts * 1000 if ts >= 0 else None for _, ts in stamps],
                 pa.timestamp("us", tz="UTC")),
        # librdkafka's 1/2 are Kafka's 0 (CreateTime) / 1 (LogAppendTime).
        pa.array([max(kind - 1, 0) for kind, _ in stamps], pa.int32()),
        pa.array([m.headers() or [] for m in msgs], pa.list_(HEADER)),
        _queues(keys),
    ], schema=ARROW_SCHEMA)
