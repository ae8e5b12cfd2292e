"""The idempotency window in snapshots (format 5): carried below the cut, restored inside its
window, its cost per key; and a format-4 snapshot (no window) still loads."""

import base64
import json
import time
from pathlib import Path

import pytest

from tests.narrow import known
from vqueues.records import Record
from vqueues.snapshot.build import build, restore
from vqueues.snapshot.capture import capture
from vqueues.snapshot.format import manifest_key
from vqueues.snapshot.wire import encode, latest
from vqueues.state.cache import RecordCache
from vqueues.state.consumer_config import LEASE
from vqueues.state.idempotency import KEY_HEADER, IdempotencyWindow, KeySection, fingerprint
from vqueues.state.partition_state import PartitionState

pytestmark = pytest.mark.unit
DATA = Path(__file__).resolve().parents[2] / "data"


def keyed(offset, key, at, value=b"v"):
    return Record(offset, at, value, ((KEY_HEADER, key.encode()),))


async def round_trip(state, window_ms=600_000, now=None):
    image = await capture(state, 0)
    chunks, manifest = encode(image, 1)
    loaded = known(latest(state.partition, [*chunks, (manifest_key(state.partition),
                                                      manifest)]))
    fresh = PartitionState(state.partition, RecordCache(1 << 20), window_ms)
    window = IdempotencyWindow.restore(window_ms, loaded.keys, now or int(time.time() * 1000))
    restore(fresh, loaded, build(loaded), window)
    return fresh, loaded, chunks


async def test_the_window_below_the_cut_survives_a_snapshot_and_later_keys_come_by_replay():
    now = int(time.time() * 1000)
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records([("q", keyed(0, "a", now)), ("q", Record(1, now, b"x", ())),
                     ("r", keyed(2, "a", now, b"other"))], None)
    fresh, loaded, _ = await round_trip(s)
    assert loaded.keys.keys == 2 == len(fresh.idempotency)
    for queue in ("q", "r"):
        assert fresh.idempotency.get(fingerprint(queue, b"a"), now) == \
            s.idempotency.get(fingerprint(queue, b"a"), now)
    # A key of a record at or after the cut is the tail's to bring.
    s.apply_records([("q", keyed(3, "later", now))], None)
    image = await capture(s, 0)
    s.apply_records([("q", keyed(4, "after-cut", now))], None)
    assert image.keys.keys == 3


async def test_keys_already_out_of_the_window_are_not_restored():
    now = int(time.time() * 1000)
    s = PartitionState(0, RecordCache(1 << 20), 10_000)
    s.apply_records([("q", keyed(0, "old", now - 9_000)), ("q", keyed(1, "new", now))], None)
    fresh, _, _ = await round_trip(s, 10_000, now=now + 2_000)
    assert len(fresh.idempotency) == 1
    assert fresh.idempotency.get(fingerprint("q", b"new"), now + 2_000) is not None


async def test_what_a_key_costs_in_a_snapshot():
    """Documented in ADR 9: about 26 bytes per key, compressed (the key's 16-byte and the
    payload's 8-byte fingerprints do not compress; offsets and timestamps nearly vanish)."""
    now = int(time.time() * 1000)
    plain, keyed_state = (PartitionState(0, RecordCache(1 << 20)) for _ in range(2))
    n = 20_000
    plain.apply_records([("q", Record(i, now + i, b"v", ())) for i in range(n)], None)
    keyed_state.apply_records([("q", keyed(i, f"key-{i}", now + i, b"v%d" % i))
                               for i in range(n)], None)
    sizes = []
    for state in (plain, keyed_state):
        chunks, _ = encode(await capture(state, 0), 1)
        sizes.append(sum(len(v) for _, v in chunks))
    per_key = (sizes[1] - sizes[0]) / n
    assert 22 < per_key < 30, per_key


async def test_a_format_4_snapshot_written_before_the_window_was_carried_still_loads():
    """tests/data/snapshot_format4.json was written by the code of format 4 (commit 9581cc0):
    queues a, b, c, a consumer, a lease consumer with a leased record, a tag, a scheduled
    record and a keyed record. It loads whole; its window starts empty, as before."""
    fixture = json.loads((DATA / "snapshot_format4.json").read_text())
    records = [(base64.b64decode(k), base64.b64decode(v)) for k, v in fixture["records"]]
    assert json.loads(records[-1][1])["v"] == 4
    loaded = known(latest(0, records))
    fresh = PartitionState(0, RecordCache(1 << 20))
    restore(fresh, loaded, build(loaded))
    assert fresh.select("a", 0, 10) == [0, 2, 4] and fresh.select("b", 0, 10) == [1]
    assert fresh.committed("a", "reader") == 2 and fresh.select_tagged("b", "red", 0, 10) == [1]
    assert fresh.schedule.by_queue == {"c": {3: 4102444800000}}
    assert fresh.configs[("b", "workers")].mode == LEASE
    assert fresh.windows[("b", "workers")].deliveries[1].attempts == 1
    assert len(fresh.idempotency) == 0 and fresh.next_offset == 5


def test_a_key_section_whose_columns_disagree_is_refused():
    section = KeySection(b"\x00" * 32, b"\x00" * 8, b"\x00" * 16, b"\x00" * 16)
    with pytest.raises(ValueError):
        IdempotencyWindow.restore(1000, section, 0)
