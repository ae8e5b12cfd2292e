"""A snapshot to and from its records on the snapshot topic: `encode` makes the chunks and
the manifest (`format`), `latest` reads the latest complete snapshot back."""

from __future__ import annotations

import codecs
import hashlib
import json
import zlib
from array import array
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import msgspec
import numpy as np

from vqueues.records import now_ms
from vqueues.snapshot.columns import column_parts, encode_offset_parts
from vqueues.snapshot.format import (
    FORMAT_VERSION,
    MAGIC,
    READABLE_VERSIONS,
    SnapshotError,
    chunk_key,
    manifest_key,
)
from vqueues.snapshot.image import Snapshot
from vqueues.state.idempotency import KeySection

CHUNK_BYTES = 900_000  # below Kafka's default 1 MB message limit
# Compression, decompression and text decoding go in steps of this many bytes: each call holds
# the GIL, so one call over the whole body would stall the loop's thread.
STEP_BYTES = 4 << 20
NAMES_STEP = 16_384  # queue names cut per C call


def encode(snapshot: Snapshot, snapshot_id: int) -> tuple[list[tuple[bytes, bytes]], bytes]:
    """The chunk records and the manifest value of `snapshot` (blocking: run it off the loop).
    Body: an 8-byte length, the msgpack of the small columns, then the offsets delta-encoded
    (`encode_offsets`), all zlib-compressed."""
    # Names as one UTF-8 text and their lengths: decoded in small steps that let the loop's
    # thread run, where a msgpack list of a million strings held the GIL for its whole decode.
    # Written in steps too (the msgpack framed by hand around them), for the same reason.
    names, lengths, text = snapshot.names, array("q"), []
    for i in range(0, len(names), NAMES_STEP):
        step = names[i:i + NAMES_STEP]
        lengths.extend(map(len, step))
        text.append("".join(step).encode("utf-8", "surrogatepass"))
    meta = [b"\x96", _bin(sum(map(len, text))), *text]  # an array of 6: the loader's msgpack
    for column in (lengths, snapshot.counts, snapshot.deleted):
        meta += [_bin(len(column) * column.itemsize), column.tobytes()]
    meta += [msgspec.msgpack.encode(snapshot.consumers),
             msgspec.msgpack.encode([snapshot.fence, snapshot.configs, snapshot.windows,
                                     snapshot.tags, snapshot.scheduled, list(snapshot.keys)])]
    body = _deflate(chain(
        (sum(map(len, meta)).to_bytes(8, "little"), *meta),
        encode_offset_parts(snapshot.offset_parts(), snapshot.counts)))
    parts = [body[i:i + CHUNK_BYTES] for i in range(0, len(body), CHUNK_BYTES)] or [b""]
    chunks = [(chunk_key(snapshot.partition, snapshot_id, i), MAGIC + part)
              for i, part in enumerate(parts)]
    manifest = json.dumps({
        "v": FORMAT_VERSION, "id": snapshot_id, "chunks": len(parts),
        "sha256": hashlib.sha256(body).hexdigest(), "data_position": snapshot.data_position,
        "offsets_position": snapshot.offsets_position, "log_start": snapshot.log_start,
        "queues": len(snapshot.names), "records": snapshot.records,
        "keys": snapshot.keys.keys, "ts": now_ms(),
    }, separators=(",", ":")).encode()
    return chunks, manifest


def _bin(size: int) -> bytes:
    """The header of a msgpack bin 32 of `size` bytes."""
    return b"\xc6" + size.to_bytes(4, "big")


def _deflate(pieces: Iterable[bytes]) -> bytes:
    z = zlib.compressobj(1)
    out: list[bytes] = []
    for piece in pieces:
        view = memoryview(piece)
        out.extend(z.compress(view[i:i + STEP_BYTES]) for i in range(0, len(view), STEP_BYTES))
    out.append(z.flush())
    return b"".join(out)


def _inflate(body: bytes) -> bytes:
    z = zlib.decompressobj()
    out: list[bytes] = []
    rest: bytes = body
    while rest:
        out.append(z.decompress(rest, STEP_BYTES))
        rest = z.unconsumed_tail
    out.append(z.flush())
    if not z.eof:
        raise SnapshotError("the snapshot's body is truncated")
    return b"".join(out)


def _names(raw: bytes | memoryview, lengths: array[int]) -> list[str]:
    """The queue names: their UTF-8 text decoded a step at a time and cut at their lengths
    (by `map`, in C, a step's names at a time: a Python loop per name is too slow for a
    takeover)."""
    decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
    view = memoryview(raw)
    ends = np.cumsum(np.frombuffer(lengths, dtype=np.int64))
    out: list[str] = []
    text, base, first = "", 0, 0  # `text` starts where name `first` does, at character `base`
    for i in range(0, len(view) + 1, STEP_BYTES):
        final = i + STEP_BYTES >= len(view)
        try:
            text += decoder.decode(view[i:i + STEP_BYTES], final)
        except UnicodeDecodeError as exc:
            raise SnapshotError(f"queue names are not UTF-8: {exc}") from None
        last = int(np.searchsorted(ends, base + len(text), side="right"))  # names complete
        if last > first:
            stops = (ends[first:last] - base).tolist()
            starts = [0, *stops[:-1]]
            for j in range(0, len(stops), NAMES_STEP):
                # A step of short names holds hundreds of thousands: cut NAMES_STEP per C call,
                # so that no one call holds the GIL long.
                out.extend(map(text.__getitem__, map(slice, starts[j:j + NAMES_STEP],
                                                     stops[j:j + NAMES_STEP])))
            text, base, first = text[stops[-1]:], base + stops[-1], last
        if final:
            break
    if first != len(ends) or text:
        raise SnapshotError("queue names do not match their lengths")
    return out


def _array(raw: bytes | memoryview) -> array[int]:
    out = array("q")
    out.frombytes(raw)
    return out


def latest(partition: int, records: Iterable[Sequence[Any]], snapshot_id: int | None = None
           ) -> Snapshot | None:
    """The latest complete snapshot among a snapshot partition's records (in log order), or
    None if there is none; with `snapshot_id`, the snapshot of that id (a parent's final
    snapshot, ADR 19). Raises SnapshotError for one that is incomplete or corrupt."""
    manifest: dict[str, int | str] | None = None
    chunks: dict[tuple[int, int], bytes | None] = {}
    for key, value, *_ in records:
        try:
            parts = json.loads(key or b"")
        except ValueError:
            continue
        final = (snapshot_id is not None and isinstance(parts, list) and len(parts) == 3
                 and parts[:2] == ["f", partition])
        if (parts == ["m", partition] or final) and value is not None:
            try:
                found = json.loads(value)
            except ValueError:
                found = {"v": -1}
            if snapshot_id is None or (isinstance(found, dict)
                                       and found.get("id") == snapshot_id):
                manifest = found
        elif isinstance(parts, list) and len(parts) == 4 and parts[:2] == ["c", partition]:
            chunks[(parts[2], parts[3])] = value
    if manifest is None:
        return None
    try:
        if manifest["v"] not in READABLE_VERSIONS:
            raise SnapshotError(f"snapshot format {manifest['v']} is not one of "
                                f"{READABLE_VERSIONS}")
        sid, count = int(manifest["id"]), int(manifest["chunks"])
        parts = []
        for i in range(count):
            part = chunks.get((sid, i))
            if part is None or not part.startswith(MAGIC):
                raise SnapshotError(f"snapshot {sid} lacks chunk {i} of {count}")
            parts.append(part[len(MAGIC):])
        body = b"".join(parts)
        if hashlib.sha256(body).hexdigest() != manifest["sha256"]:
            raise SnapshotError(f"snapshot {sid}: chunks do not match the manifest's digest")
        data = memoryview(_inflate(body))  # sliced below without copies
        size = int.from_bytes(data[:8], "little")
        text, lengths, counts, deleted, consumers, *more = msgspec.msgpack.decode(
            data[8:8 + size])
        fence, configs, work, *rest = more[0] if more else (0, [], [])
        tags = rest[0] if rest else []
        scheduled = rest[1] if len(rest) > 1 else []
        keys = KeySection(*map(bytes, rest[2])) if len(rest) > 2 else KeySection.empty()
        counts = _array(counts)
        raw = data[8 + size:]
        column: memoryview | None = None
        if manifest["v"] >= 4:
            column_parts(raw, counts)  # checked now, decoded by `build`
            offsets, column = array("q"), raw
        else:
            offsets = _array(raw)
        image = Snapshot(partition, int(manifest["data_position"]),
                         int(manifest["offsets_position"]), int(manifest["log_start"]),
                         _names(text, _array(lengths)),
                         counts, _array(deleted), offsets,
                         [(int(i), str(c), int(o), int(a)) for i, c, o, a in consumers],
                         int(fence), [tuple(x) for x in configs],
                         [tuple(x) for x in work], [tuple(x) for x in tags],
                         [tuple(x) for x in scheduled], keys, column)
        if not len(image.names) == len(image.counts) == len(image.deleted) or \
                (column is None and sum(image.counts) != len(image.offsets)):
            raise SnapshotError(f"snapshot {sid}: its columns do not agree")
        return image
    except (KeyError, TypeError, ValueError, zlib.error, msgspec.DecodeError) as exc:
        raise SnapshotError(f"unreadable snapshot: {exc!r}") from None


def manifest_of(records: Sequence[Sequence[Any]], partition: int
                ) -> dict[str, int] | None:
    """The last manifest among a snapshot partition's records (id and chunk count)."""
    found = None
    for key, value, *_ in records:
        if key == manifest_key(partition) and value is not None:
            try:
                found = json.loads(value)
            except ValueError:
                continue
    return found
