"""The snapshot format on the snapshot topic (ADR 7): its version, keys and chunk magic, and
the error for a snapshot that cannot be used.

Snapshot topic partition p holds data partition p's snapshots:
  ["c", p, id, i] -> "VQS2" + part i of the zlib body (columns, offsets delta-encoded)
                                                                    chunks, each < 1 MB
  ["m", p]        -> JSON manifest {"v", "id", "chunks", "sha256", "data_position",
                                    "offsets_position", "log_start", "queues", "records", "ts"}
The manifest is written after every chunk was acknowledged: a reader never loads half a
snapshot, and one whose chunks are missing or do not match the manifest's digest is ignored
with a warning (the partition is then replayed in full).
"""

from __future__ import annotations

import json

FORMAT_VERSION = 9
# Format 2 has no lease state; formats 2 and 3 hold the offsets raw, formats 4 to 7
# delta-encoded; format 5 adds the idempotency window (before it, a restored window starts
# empty); format 6 adds each delivery's grant and each window's keys in the offset topic
# (ADR 12; a window of an older format is taken for ADR 8's, and checkpointed at its first
# write); format 7 adds each consumer's in-flight cap and the prefix its settings came from
# (ADR 13; an older row has neither); format 8 adds each consumer's `durable_grants` (ADR 16;
# an older row writes grants behind); format 9 adds each consumer's attributes (an SQS
# queue's, ADR 17; an older row has none).
READABLE_VERSIONS = (2, 3, 4, 5, 6, 7, 8, 9)
MAGIC = b"VQS2"


class SnapshotError(Exception):
    """A snapshot that cannot be used (incomplete, corrupt, another format)."""


def _key(*parts: str | int) -> bytes:
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode()


def manifest_key(partition: int) -> bytes:
    return _key("m", partition)


def final_manifest_key(partition: int, snapshot_id: int) -> bytes:
    """The manifest of a layout's final snapshot of `partition` (ADR 19), under a key no
    later snapshot overwrites, so compaction keeps it."""
    return _key("f", partition, snapshot_id)


def chunk_key(partition: int, snapshot_id: int, index: int) -> bytes:
    return _key("c", partition, snapshot_id, index)

