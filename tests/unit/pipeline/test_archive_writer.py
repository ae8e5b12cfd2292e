"""The archive writer's layout and commit, with pyarrow only (no Spark session, no broker)."""

import datetime as dt

import pytest

pytest.importorskip("pyspark", reason="the pipeline extra (pyspark) is not installed")

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from vqueues.pipeline.archive import (
    ArchiveCommit,
    discard,
    holds_files,
    laid_out,
    publish,
    write_task,
)
from vqueues.pipeline.arrow import ARROW_SCHEMA_BUCKETED
from vqueues.pipeline.layout import archive_bucket

DAY1 = dt.datetime(2026, 11, 21, 23, 59, tzinfo=dt.UTC)
DAY2 = dt.datetime(2026, 11, 22, 0, 1, tzinfo=dt.UTC)


def batch(rows):
    """rows: (queue, partition, offset, timestamp) -> a record batch in the source's schema."""
    cols = {
        "key": [None if q is None else q.encode() for q, *_ in rows],
        "value": [f"v{o}".encode() for _, _, o, _ in rows],
        "topic": ["vq-data"] * len(rows),
        "partition": [p for _, p, _, _ in rows],
        "offset": [o for _, _, o, _ in rows],
        "timestamp": [t for *_, t in rows],
        "timestampType": [0] * len(rows),
        "headers": [[{"key": "h", "value": b"1"}]] * len(rows),
        "queue": [q for q, *_ in rows],
        "bucket": [archive_bucket(q, 4) for q, *_ in rows],
    }
    return pa.RecordBatch.from_pydict(cols, schema=ARROW_SCHEMA_BUCKETED)


ROWS = [("b", 1, 7, DAY1), ("a", 0, 3, DAY2), ("a", 0, 1, DAY1), ("c/d", 2, 5, DAY2),
        (None, 3, 9, DAY1), ("a", 0, 2, DAY1), ("ü" * 80, 1, 4, DAY2)]


def test_records_are_sorted_by_date_bucket_queue_partition_offset():
    t = laid_out(pa.Table.from_batches([batch(ROWS)]))
    keys = list(zip(t.column("day").to_pylist(), t.column("bucket").to_pylist(),
                    t.column("queue").to_pylist(), t.column("offset").to_pylist(), strict=True))
    # Keyless records (null queue) sort last within their bucket.
    assert keys == sorted(keys, key=lambda k: (k[0], k[1], k[2] is None, k[2] or "", k[3]))
    days = {(dt.date(1970, 1, 1) + dt.timedelta(days=d)).isoformat()
            for d in t.column("day").to_pylist()}
    assert days == {"2026-11-21", "2026-11-22"}


def test_a_task_writes_one_file_per_date_and_bucket_and_publish_names_them_by_batch(tmp_path):
    root = str(tmp_path / "archive")
    commit = write_task(iter([batch(ROWS[:4]), batch(ROWS[4:])]), root, 1 << 30)
    rels = [f.rel for _, f in commit.files]
    assert len(rels) == len(set(rels))  # one file per (date, bucket)
    publish(root, [commit], "part-0000000007-")
    assert not (tmp_path / "archive" / "_staging" / commit.staging).exists()
    files = sorted(p.relative_to(tmp_path / "archive").as_posix()
                   for p in (tmp_path / "archive").rglob("*.parquet"))
    assert files == sorted(f"{r}/part-0000000007-000.parquet" for r in rels)
    table = ds.dataset(root, partitioning="hive").to_table()
    assert sorted(table.column("offset").to_pylist()) == sorted(o for _, _, o, _ in ROWS)
    assert pq.read_schema(tmp_path / "archive" / files[0]).names == [
        "queue", "partition", "offset", "timestamp", "headers", "key", "value"]


def test_buckets_are_standard_mmh3_whatever_the_batch_holds():
    import mmh3

    from vqueues.pipeline.arrow import ARROW_SCHEMA, with_bucket

    plain = batch(ROWS).select(ARROW_SCHEMA.names)
    got = with_bucket(plain, 4).column("bucket").to_pylist()
    assert got == [0 if q is None else (mmh3.hash(q.encode(), 0) & 0x7FFFFFFF) % 4
                   for q, *_ in ROWS]


def test_one_queue_is_read_back_from_its_bucket_in_offset_order(tmp_path):
    root = str(tmp_path / "archive")
    publish(root, [write_task(iter([batch(ROWS)]), root, 1 << 30)], "part-0000000000-")
    q = "a"
    got = ds.dataset(root, partitioning="hive").to_table(
        filter=(ds.field("bucket") == archive_bucket(q, 4)) & (ds.field("queue") == q))
    assert got.column("offset").to_pylist() == [1, 2, 3]


def test_a_batch_published_again_replaces_its_files_and_adds_nothing(tmp_path):
    root = str(tmp_path / "archive")
    # First run: two writer tasks, then the same batch again with one task (fewer files).
    first = [write_task(iter([batch(ROWS[:3])]), root, 1 << 30),
             write_task(iter([batch(ROWS[3:])]), root, 1 << 30)]
    first = [ArchiveCommit(c.staging, i, c.files) for i, c in enumerate(first)]
    publish(root, list(first), "part-0000000003-")
    publish(root, [write_task(iter([batch(ROWS)]), root, 1 << 30)], "part-0000000003-")
    table = ds.dataset(root, partitioning="hive").to_table()
    assert sorted(table.column("offset").to_pylist()) == sorted(o for _, _, o, _ in ROWS)


def test_a_writer_flushes_when_it_holds_flush_bytes(tmp_path):
    root = str(tmp_path / "archive")
    commit = write_task(iter([batch(ROWS[:2]), batch(ROWS[2:4]), batch(ROWS[4:])]), root, 1)
    assert {n for n, _ in commit.files} == {0, 1, 2}  # a flush after every batch
    publish(root, [commit], "part-0000000000-")
    assert ds.dataset(root, partitioning="hive").to_table().num_rows == len(ROWS)


def test_an_aborted_batch_leaves_nothing(tmp_path):
    root = str(tmp_path / "archive")
    commit = write_task(iter([batch(ROWS)]), root, 1 << 30)
    discard(root, [commit, None])
    assert not list((tmp_path / "archive").rglob("*.parquet"))
    assert not holds_files(str(tmp_path / "archive" / "_staging"))
    assert not holds_files(str(tmp_path / "nowhere"))
