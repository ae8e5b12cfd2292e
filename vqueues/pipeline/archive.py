"""The archive writer: one micro-batch's records into Parquet files of the archive's layout
(vqueues/pipeline/layout.py), written with pyarrow inside the Spark tasks.

Spark's own writer needs the records shuffled by (date, bucket) to write one file per date and
bucket; that shuffle (rows to the JVM, sorted, spilled, read back) was most of the archive's
cost. Here a few writer tasks (`coalesce`, no shuffle) each sort what they read in Arrow and
write one file per date and bucket they hold, so a micro-batch writes at most
writers x dates x buckets files (x flushes, when a writer holds more than `flush_bytes`).

A task writes under `<archive>/_staging/<random>/` and answers the files it wrote; the driver
then moves them to names made of the batch id, so a batch that runs again writes the same
names: exactly-once with the checkpoint. Readers skip `_staging` (Spark and pyarrow ignore
names that start with `_`).
"""

from __future__ import annotations

import datetime as dt
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

# The columns of an archive file, in order (date and bucket are in the directory names).
COLUMNS = ("queue", "partition", "offset", "timestamp", "headers", "key", "value")
MICROS_PER_DAY = 86_400_000_000
NO_DATE = "__HIVE_DEFAULT_PARTITION__"  # Spark's name for a null partition value
DEFAULT_FLUSH_BYTES = 128 * 1024 * 1024
ROW_GROUP_ROWS = 65_536  # small enough that one queue's records skip most row groups


@dataclass(frozen=True)
class ArchiveFile:
    rel: str  # date=<d>/bucket=<b>
    path: str  # <rel>/<name>.parquet, under the directory it was written to
    records: int


def laid_out(table: pa.Table) -> pa.Table:
    """`table` (source columns with `bucket`) plus `day` (UTC days since 1970 of the
    timestamp), sorted by day, bucket, queue, partition and offset.

    Sorting on strings is what costs, so the queue is replaced by its rank among the batch's
    distinct queues (a few thousand to sort, not every record), and all five keys are
    integers."""
    micros = table.column("timestamp").cast(pa.timestamp("us")).cast(pa.int64())
    day = pc.divide(micros, MICROS_PER_DAY).cast(pa.int32())  # timestamps are >= 0 in Kafka
    queues = table.column("queue")
    distinct = pc.unique(queues)
    rank = pc.rank(distinct, sort_keys="ascending")  # nulls (keyless) last
    by_queue = pc.take(rank, pc.index_in(queues, value_set=distinct))
    keys = pa.table({"day": day, "bucket": table.column("bucket"), "q": by_queue,
                     "partition": table.column("partition"), "offset": table.column("offset")})
    order = pc.sort_indices(keys, sort_keys=[(k, "ascending") for k in keys.column_names])
    return table.append_column("day", day).take(order)


def _date(day: int | None) -> str:
    if day is None:
        return NO_DATE
    return (dt.date(1970, 1, 1) + dt.timedelta(days=day)).isoformat()


def write_files(table: pa.Table, directory: str, name: str, filesystem: Any = None
                ) -> list[ArchiveFile]:
    """Write `table` (from `laid_out`) as one Parquet file per date and bucket, each
    `<directory>/date=<d>/bucket=<b>/<name>.parquet`."""
    import pyarrow.parquet as pq

    n = table.num_rows
    if n == 0:
        return []
    days, buckets = table.column("day"), table.column("bucket")
    # Sorted, so each (day, bucket) is one run of rows: cut where either changes.
    change = pc.or_kleene(pc.not_equal(days.slice(1), days.slice(0, n - 1)),
                          pc.not_equal(buckets.slice(1), buckets.slice(0, n - 1)))
    change = pc.or_(pc.fill_null(change, False),
                    pc.not_equal(pc.is_null(days.slice(1)), pc.is_null(days.slice(0, n - 1))))
    cuts = [0, *(i + 1 for i in pc.indices_nonzero(change).to_pylist()), n]
    body = table.select(list(COLUMNS))
    out = []
    for lo, hi in pairwise(cuts):
        rel = f"date={_date(days[lo].as_py())}/bucket={buckets[lo].as_py()}"
        path = f"{rel}/{name}.parquet"
        if filesystem is not None:
            filesystem.create_dir(f"{directory}/{rel}", recursive=True)
        else:
            os.makedirs(f"{directory}/{rel}", exist_ok=True)
        pq.write_table(body.slice(lo, hi - lo), f"{directory}/{path}", filesystem=filesystem,
                       row_group_size=ROW_GROUP_ROWS, compression="snappy")
        out.append(ArchiveFile(rel, path, hi - lo))
    return out


@dataclass(frozen=True)
class ArchiveCommit(WriterCommitMessage):
    """What one writer task wrote: its staging directory (under `_staging/`) and files."""

    staging: str
    task: int
    files: tuple[tuple[int, ArchiveFile], ...]  # (flush, file)


class ArchiveSink(DataSource):
    """The archive's sink, registered as `vqueues-archive`:
    `df.writeStream.format("vqueues-archive").option("path", <archive>)` (streaming) or
    `df.write.format("vqueues-archive").mode("append").option("path", <archive>).save()`
    (a batch, e.g. a migration). The input needs the source's columns and `bucket`. Options:
    `path` (required), `flushBytes` (a writer task writes its files whenever it holds this
    many bytes of records; default 128 MiB)."""

    @classmethod
    def name(cls) -> str:
        return "vqueues-archive"

    def _checked(self, schema: StructType) -> tuple[str, int]:
        path = self.options.get("path")
        if not path:
            raise ValueError("vqueues-archive: option path is required")
        missing = {"bucket", *COLUMNS} - set(schema.fieldNames())
        if missing:
            raise ValueError(f"vqueues-archive: the input lacks columns {sorted(missing)}")
        flush = int(self.options.get("flushBytes") or self.options.get("flushbytes")
                    or DEFAULT_FLUSH_BYTES)
        if flush < 1:
            raise ValueError("vqueues-archive: flushBytes must be at least 1")
        return path, flush

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return ArchiveStreamWriter(*self._checked(schema))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise ValueError("vqueues-archive: an archive is only appended to (mode append)")
        return ArchiveBatchWriter(*self._checked(schema))


class ArchiveStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch: tasks write under `_staging/`, then `commit` (on the driver) names the
    files after the batch id, `part-<batch id>-<k>.parquet`, first deleting what an earlier run
    of the same batch left under those names."""

    def __init__(self, path: str, flush_bytes: int) -> None:
        self.path = path
        self.flush_bytes = flush_bytes

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ArchiveCommit:
        return write_task(iterator, self.path, self.flush_bytes)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        publish(self.path, messages, f"part-{batchId:010d}-")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        discard(self.path, messages)


class ArchiveBatchWriter(DataSourceArrowWriter):
    """One batch write: as a micro-batch, with a random job id in place of the batch id."""

    def __init__(self, path: str, flush_bytes: int) -> None:
        self.path = path
        self.flush_bytes = flush_bytes
        self.job = f"b{uuid.uuid4().hex[:12]}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> ArchiveCommit:
        return write_task(iterator, self.path, self.flush_bytes)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        publish(self.path, messages, f"part-{self.job}-")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        discard(self.path, messages)


def write_task(batches: Iterator[pa.RecordBatch], path: str, flush_bytes: int
               ) -> ArchiveCommit:
    """One writer task: hold the task's records, lay them out and write them under
    `<path>/_staging/<random>/` whenever `flush_bytes` are held, and at the end."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    token = uuid.uuid4().hex
    fs, root = _filesystem(path)
    staging = f"{root}/_staging/{token}"
    files: list[tuple[int, ArchiveFile]] = []
    held: list[pa.RecordBatch] = []
    size = 0

    def flush() -> None:
        n = len({k for k, _ in files})  # flushes so far (each writes at least one file)
        table = laid_out(pa.Table.from_batches(held))
        files.extend((n, f) for f in write_files(table, staging, f"f{n:04d}", fs))

    for batch in batches:
        if batch.num_rows:
            held.append(batch)
            size += batch.nbytes
        if size >= flush_bytes:
            flush()
            held, size = [], 0
    if held:
        flush()
    return ArchiveCommit(token, ctx.partitionId() if ctx is not None else 0, tuple(files))


def publish(path: str, messages: list[WriterCommitMessage | None], prefix: str) -> None:
    """On the driver, once every task wrote: move the tasks' files to
    `<rel>/<prefix><k>.parquet`, k numbered per directory in (task, flush) order, so the same
    records give the same names; files already named with `prefix` are deleted first."""
    from pyarrow.fs import FileSelector, FileType

    fs, root = _filesystem(path)
    moves = sorted((f.rel, m.task, n, f"{root}/_staging/{m.staging}/{f.path}")
                   for m in messages if isinstance(m, ArchiveCommit) for n, f in m.files)
    for rel in sorted({rel for rel, *_ in moves}):
        fs.create_dir(f"{root}/{rel}", recursive=True)
        for info in fs.get_file_info(FileSelector(f"{root}/{rel}")):
            if info.type == FileType.File and info.base_name.startswith(prefix):
                fs.delete_file(info.path)  # this batch ran before: the same records
    seen: dict[str, int] = {}
    for rel, _, _, src in moves:
        k = seen[rel] = seen.get(rel, -1) + 1
        fs.move(src, f"{root}/{rel}/{prefix}{k:03d}.parquet")
    discard(path, messages)


def discard(path: str, messages: list[WriterCommitMessage | None]) -> None:
    """Delete the tasks' staging directories (what is left in them)."""
    from pyarrow.fs import FileType

    fs, root = _filesystem(path)
    for m in messages:
        if isinstance(m, ArchiveCommit):
            staging = f"{root}/_staging/{m.staging}"
            if fs.get_file_info(staging).type == FileType.Directory:
                fs.delete_dir(staging)


def holds_files(path: str) -> bool:
    """Whether `path` exists and holds anything."""
    from pyarrow.fs import FileSelector, FileType

    fs, root = _filesystem(path)
    if fs.get_file_info(root).type != FileType.Directory:
        return False
    return bool(fs.get_file_info(FileSelector(root)))


def _filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's filesystem for a local path or a URI (file:, s3:, gs:, hdfs:, ...)."""
    from pyarrow import fs

    if "://" not in uri and not uri.startswith("file:"):
        return fs.LocalFileSystem(), os.path.abspath(uri)
    if uri.startswith("file:") and not uri.startswith("file://"):
        return fs.LocalFileSystem(), uri[len("file:"):]
    if uri.startswith(("s3a://", "s3n://")):
        uri = "s3://" + uri[len("s3a://"):]  # Hadoop's names for S3; pyarrow's is s3
    filesystem, root = fs.FileSystem.from_uri(uri)
    return filesystem, str(root)
