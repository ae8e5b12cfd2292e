"""Index snapshots: a partition's state written to the compacted snapshot topic, so that a node
taking the partition over loads it and replays only what came after (ADR 7).

A snapshot holds, as of a **cut** (data position P, offset-topic position O), every queue's
retained offsets, deletion floor and consumers. It is captured in chunks across loop turns;
changes made meanwhile may leak into later chunks, which is harmless: records are only ever
appended at or above P (the capture keeps offsets below P), retention only trims what a loader
trims too, and every offset-topic entry is last-writer-wins, so replaying the entries from O on
top of the snapshot yields the state a full replay builds (tested with random histories).

On the wire (snapshot topic partition p holds data partition p's snapshots):
  ["c", p, id, i] -> "VQS1" + zlib part i of the msgpack body      chunks, each < 1 MB
  ["m", p]        -> JSON manifest {"v", "id", "chunks", "sha256", "data_position",
                                    "offsets_position", "log_start", "queues", "records", "ts"}
The manifest is written after every chunk was acknowledged: a reader never loads half a
snapshot, and one whose chunks are missing or do not match the manifest's digest is ignored
with a warning (the partition is then replayed in full).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import operator
import zlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec

from vqueues.partition_state import PartitionState, QueueIndex
from vqueues.records import now_ms

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAGIC = b"VQS1"
CHUNK_BYTES = 900_000  # below Kafka's default 1 MB message limit
CAPTURE_CHUNK = 5000  # queues copied per loop turn

# One queue: (name, deleted_before, offsets as little-endian int64 deltas, consumers).
QueueImage = tuple[str, int, bytes, list[tuple[str, int, int]]]


class SnapshotError(Exception):
    """A snapshot that cannot be used (incomplete, corrupt, another format)."""


@dataclass(slots=True)
class Snapshot:
    partition: int
    data_position: int  # P: every record below it is in the snapshot
    offsets_position: int  # O: every offset-topic entry below it is in the snapshot
    log_start: int
    queues: list[QueueImage]

    @property
    def records(self) -> int:
        return sum(len(q[2]) // 8 for q in self.queues)


def _deltas(offsets: array[int]) -> bytes:
    if len(offsets) < 2:
        return offsets.tobytes()
    out = array("q", offsets[:1])
    out.extend(map(operator.sub, offsets[1:], offsets[:-1]))
    return out.tobytes()


def _undeltas(raw: bytes) -> array[int]:
    deltas = array("q")
    deltas.frombytes(raw)
    return array("q", itertools.accumulate(deltas))


async def capture(state: PartitionState, offsets_position: int) -> Snapshot:
    """Copy `state` as of now (the cut), a chunk of queues per loop turn. The caller makes sure
    no offset-topic write is in flight at the cut, so `offsets_position` matches the state."""
    cut = state.next_offset
    log_start = state.log_start
    names = list(state.queues)
    images: list[QueueImage] = []
    for i in range(0, len(names), CAPTURE_CHUNK):
        for name in names[i:i + CAPTURE_CHUNK]:
            q = state.queues.get(name)
            if q is None:
                continue
            offsets = q.offsets
            if offsets and offsets[-1] >= cut:  # appended after the cut
                offsets = offsets[:q.position(cut)]
            consumers = [(c, off, at) for c, (off, at) in q.consumers.items()]
            images.append((name, q.deleted_before, _deltas(offsets), consumers))
        await asyncio.sleep(0)
        if state.revoked:
            raise SnapshotError("partition revoked during the capture")
    return Snapshot(state.partition, cut, offsets_position, log_start, images)


def _key(*parts: str | int) -> bytes:
    return json.dumps(parts, ensure_ascii=False, separators=(",", ":")).encode()


def manifest_key(partition: int) -> bytes:
    return _key("m", partition)


def chunk_key(partition: int, snapshot_id: int, index: int) -> bytes:
    return _key("c", partition, snapshot_id, index)


def encode(snapshot: Snapshot, snapshot_id: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The chunk records and the manifest value of `snapshot` (blocking: run it off the loop)."""
    body = zlib.compress(msgspec.msgpack.encode(snapshot.queues), 1)
    parts = [body[i:i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)] or [b""]
    chunks = [(chunk_key(snapshot.partition, snapshot_id, i), MAGIC + part)
              for i, part in enumerate(parts)]
    manifest = json.dumps({
        "v": FORMAT_VERSION, "id": snapshot_id, "chunks": len(parts),
        "sha256": hashlib.sha256(body).hexdigest(), "data_position": snapshot.data_position,
        "offsets_position": snapshot.offsets_position, "log_start": snapshot.log_start,
        "queues": len(snapshot.queues), "records": snapshot.records, "ts": now_ms(),
    }, separators=(",", ":")).encode()
    return chunks, manifest


def latest(partition: int, records: Iterable[tuple[bytes | None, bytes | None]]
           ) -> Snapshot | None:
    """The latest complete snapshot among a snapshot partition's records (in log order), or
    None if there is none. Raises SnapshotError for one that is incomplete or corrupt."""
    manifest: dict[str, int | str] | None = None
    chunks: dict[tuple[int, int], bytes | None] = {}
    for key, value in records:
        try:
            parts = json.loads(key or b"")
        except ValueError:
            continue
        if parts == ["m", partition] and value is not None:
            try:
                manifest = json.loads(value)
            except ValueError:
                manifest = {"v": -1}
        elif isinstance(parts, list) and len(parts) == 4 and parts[:2] == ["c", partition]:
            chunks[(parts[2], parts[3])] = value
    if manifest is None:
        return None
    try:
        if manifest["v"] != FORMAT_VERSION:
            raise SnapshotError(f"snapshot format {manifest['v']} is not {FORMAT_VERSION}")
        sid, count = int(manifest["id"]), int(manifest["chunks"])
        body = b""
        for i in range(count):
            part = chunks.get((sid, i))
            if part is None or not part.startswith(MAGIC):
                raise SnapshotError(f"snapshot {sid} lacks chunk {i} of {count}")
            body += part[len(MAGIC):]
        if hashlib.sha256(body).hexdigest() != manifest["sha256"]:
            raise SnapshotError(f"snapshot {sid}: chunks do not match the manifest's digest")
        queues = msgspec.msgpack.decode(zlib.decompress(body))
        return Snapshot(partition, int(manifest["data_position"]),
                        int(manifest["offsets_position"]), int(manifest["log_start"]),
                        [(q[0], q[1], q[2], [tuple(c) for c in q[3]]) for q in queues])
    except (KeyError, TypeError, ValueError, zlib.error, msgspec.DecodeError) as exc:
        raise SnapshotError(f"unreadable snapshot: {exc!r}") from None


def manifest_of(records: Sequence[tuple[bytes | None, bytes | None]], partition: int
                ) -> dict[str, int] | None:
    """The last manifest among a snapshot partition's records (id and chunk count)."""
    found = None
    for key, value in records:
        if key == manifest_key(partition) and value is not None:
            try:
                found = json.loads(value)
            except ValueError:
                continue
    return found


async def restore(state: PartitionState, snapshot: Snapshot) -> None:
    """Fill a fresh `state` from `snapshot`, a chunk of queues per loop turn; the tail then
    continues at `snapshot.data_position`."""
    for i in range(0, len(snapshot.queues), CAPTURE_CHUNK):
        listed = []
        for name, deleted_before, raw, consumers in snapshot.queues[i:i + CAPTURE_CHUNK]:
            q = QueueIndex()
            q.offsets = _undeltas(raw)
            q.deleted_before = deleted_before
            q.consumers = {c: (off, at) for c, off, at in consumers}
            state.queues[name] = q
            if q.listed:
                listed.append(name)
        state.names.update(listed)
        await asyncio.sleep(0)
    state.log_start = snapshot.log_start
    state.next_offset = state.tail_offset = snapshot.data_position
    state.offsets_position = snapshot.offsets_position
