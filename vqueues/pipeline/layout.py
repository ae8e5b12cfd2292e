"""The archive's layout: `<output>/archive/date=<yyyy-mm-dd>/bucket=<b>/*.parquet`.

Records are partitioned by time (the record timestamp's UTC date), never by queue, so any valid
queue name works (it is a column, not a directory) and a million queues do not make a million
directories. Within a date, records go to one of `buckets` buckets by a standard 32-bit
MurmurHash3 (mmh3, seed 0) of the queue name's UTF-8 bytes, and within a file they are sorted by
queue, partition and offset: one queue's records sit in one bucket directory per date, in few
row groups. This module needs no Spark: any Python reader, or a node, finds a queue's bucket.
"""

from __future__ import annotations

import mmh3

DEFAULT_BUCKETS = 64
LAYOUT_VERSION = 2


def archive_bucket(queue: str | None, buckets: int = DEFAULT_BUCKETS) -> int:
    """The bucket of `queue` (keyless records: bucket 0)."""
    return archive_buckets([queue], buckets)[0]


def archive_buckets(queues: list[str | None], buckets: int = DEFAULT_BUCKETS) -> list[int]:
    """`archive_bucket` of each of `queues`, in one loop (the source's hot path)."""
    h = mmh3.hash
    return [0 if q is None else (h(q.encode("utf-8", "surrogatepass"), 0) & 0x7FFFFFFF) % buckets
            for q in queues]
