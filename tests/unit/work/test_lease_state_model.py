"""Lease state replays to exactly what its owner answered from (ADR 12) when grants are written
before the answer (`durable_grants`), checked on random histories: concurrent workers, leases
that expire, retries, extensions, dead letters, ordering keys, and failovers between any two
writes: a plain replay, a replay of the offset log as Kafka's compaction leaves it (with and
without its tombstones), a snapshot plus the entries after it, and a zombie (the old owner, not
knowing it lost the partition) writing after the takeover. Invariants on the way: a completed
record is never delivered again, a record of an ordering key is leased only once every earlier
record of its key is done, and a token of a lost grant is refused everywhere.

With grants written behind the answer (the default, ADR 16), an owner that dies with grant
writes in flight costs at most what docs/work-queues.md states: those records are leasable
again with their attempt count one lower, their tokens are refused, and nothing answered of a
completion, retry or extension is lost."""

import asyncio
import random
from collections import Counter

import pytest

from tests.narrow import known
from tests.unit.fakes import MemoryLog
from tests.unit.nodes import fill, snapshot_round_trip, work_node
from vqueues.errors import VQError
from vqueues.records import (
    DeliveryUpdated,
    decode_offset_entry,
    encode_offset_entry,
    generation_header,
    generation_of,
)
from vqueues.settings import Settings
from vqueues.state.partition_state import PartitionState
from vqueues.state.tokens import parse_token

pytestmark = pytest.mark.unit
QUEUE, CONSUMER = "h", "w"
CLOCK_MODULES = ("work.consumer_configs", "work.dead_letters", "work.lease_choice",
                 "state.lease_windows", "state.partition_state", "records", "queues.service",
                 "state.window_writes", "work.work_service")


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    import importlib
    c = Clock()
    for name in CLOCK_MODULES:
        monkeypatch.setattr(importlib.import_module(f"vqueues.{name}"), "now_ms", c)
    return c


def view(state: PartitionState) -> tuple[int, int, dict[int, str | tuple[object, ...]]]:
    """What a lease consumer's state answers from: its mark, its dead letters, and each record
    of the queue above the mark: done, new (never delivered), or its delivery."""
    committed = state.committed(QUEUE, CONSUMER) or 0
    work = state.windows[(QUEUE, CONSUMER)]
    records: dict[int, str | tuple[object, ...]] = {}
    for off in state.queues[QUEUE].offsets:
        if off < committed:
            continue
        d = work.deliveries.get(off)
        if off in work.done:
            records[off] = "done"
        elif d is None or (d.attempts == 0 and d.until == 0):
            records[off] = "new"
        else:
            records[off] = (d.leased, d.until, d.attempts, d.grant, d.reason)
    return committed, work.dead_lettered, records


def compacted(log: MemoryLog, partition: int, drop_tombstones: bool) -> MemoryLog:
    """The offset log as compaction leaves it: the latest entry of each key, in log order
    (and, past `delete.retention.ms`, no tombstones)."""
    entries = log.partitions.get(partition, [])
    last = {key: i for i, (key, _, _) in enumerate(entries)}
    out = MemoryLog()
    out.partitions = {p: list(entries) for p, entries in log.partitions.items()}
    out.partitions[partition] = [e for i, e in enumerate(entries) if last[e[0]] == i
                                 and not (drop_tombstones and e[1] is None)]
    return out


async def replayed_view(data_log, offset_log, settings, partition):
    """What a new owner would rebuild, on a copy of the offset log (a real takeover fences
    the owner it checks)."""
    copy = MemoryLog()
    copy.partitions = {p: list(entries) for p, entries in offset_log.partitions.items()}
    svc, _ = await work_node(data_log, copy, settings)
    try:
        return view(svc.ownership.require(partition))
    finally:
        svc.close()


async def snapshot_view(state: PartitionState, offset_log: MemoryLog):
    """A snapshot of `state`, loaded into a fresh partition, then the entries after it."""
    fresh, loaded = await snapshot_round_trip(state)
    after = offset_log.partitions[state.partition][loaded.offsets_position:]
    fresh.apply_logged([(generation_of(h), e) for k, v, h in after
                        if (e := decode_offset_entry(k, v)) is not None])
    fresh.frontier.start_at(state.next_offset)  # the data records are the state's own
    fresh.index, fresh.tags = state.index, state.tags
    return view(fresh)


class History:
    """Random calls of concurrent workers on one queue, with the invariants checked."""

    def __init__(self, rnd: random.Random, clock: Clock) -> None:
        self.rnd = rnd
        self.clock = clock
        self.held: list[str] = []
        self.completed: set[int] = set()
        self.keys: dict[int, str | None] = {}
        self.delivered: Counter[int] = Counter()  # deliveries of each record, by any owner

    async def step(self, svc, work) -> None:
        calls = [self.call(svc, work) for _ in range(self.rnd.randint(1, 4))]
        await asyncio.gather(*calls)

    async def call(self, svc, work) -> None:
        rnd = self.rnd
        action = rnd.random()
        try:
            if action < 0.2:
                key = rnd.choice([None, None, "x", "y"])
                for off in await fill(svc, QUEUE, rnd.randint(1, 5), key=key):
                    self.keys[off] = key
            elif action < 0.45:
                got = (await work.lease(QUEUE, CONSUMER, rnd.randint(1, 6),
                                        rnd.choice([100, 60_000]), 0)).records
                state = svc.ownership.require(svc.partition_of(QUEUE))
                for r in got:
                    off = r.record.offset
                    self.delivered[off] += 1
                    assert off not in self.completed, "a completed record came back"
                    key = self.keys.get(off)
                    if key is not None:  # every earlier record of its key is done
                        committed = state.committed(QUEUE, CONSUMER) or 0
                        work_state = state.windows[(QUEUE, CONSUMER)]
                        assert all(o < committed or o in work_state.done
                                   for o, k in self.keys.items() if k == key and o < off)
                self.held += [r.token for r in got]
            elif action < 0.55 and self.held:
                tokens = rnd.sample(self.held, rnd.randint(1, min(3, len(self.held))))
                await work.complete(QUEUE, CONSUMER, tokens)
                self.completed.update(known(parse_token(t))[0] for t in tokens)
                self.drop(tokens)
            elif action < 0.65 and self.held:  # completions riding on the next lease
                tokens = rnd.sample(self.held, rnd.randint(1, min(3, len(self.held))))
                page = await work.lease(QUEUE, CONSUMER, rnd.randint(0, 3),
                                        rnd.choice([100, 60_000]), 0, complete=tokens)
                assert page.completed is not None and page.refused is not None
                assert {r.token for r in page.refused} | set(page.completed) == set(tokens)
                assert all(r.code == "lease_expired" for r in page.refused)
                self.completed.update(known(parse_token(t))[0] for t in page.completed)
                for r in page.records:
                    off = r.record.offset
                    self.delivered[off] += 1
                    assert off not in self.completed, "a completed record came back"
                self.held += [r.token for r in page.records]
                self.drop(tokens)
            elif action < 0.78 and self.held:
                tokens = [rnd.choice(self.held)]
                await work.retry(QUEUE, CONSUMER, tokens, rnd.choice([0, 50, 500]), "r")
                self.drop(tokens)
            elif action < 0.85 and self.held:
                await work.extend(QUEUE, CONSUMER, [rnd.choice(self.held)], 60_000)
            else:
                self.clock.now += rnd.choice([0, 60, 150, 400])
        except VQError as exc:
            assert exc.code == "lease_expired", exc
            self.drop(exc.details.get("stale", []))

    def drop(self, tokens) -> None:
        gone = set(tokens)
        self.held = [t for t in self.held if t not in gone]


@pytest.mark.parametrize("seed", range(12))
async def test_random_histories_replay_to_the_owners_state(clock, seed):
    rnd = random.Random(seed)
    settings = Settings(write_visible_timeout_ms=1000, max_lease_window=40)
    data_log, offset_log = MemoryLog(), MemoryLog()
    svc, work = await work_node(data_log, offset_log, settings)
    await work.configure(QUEUE, CONSUMER, "lease", 3, "h-dlq", None, durable_grants=True)
    p = svc.partition_of(QUEUE)
    history = History(rnd, clock)
    nodes = [svc]
    failovers = 0
    for _ in range(250):
        await history.step(svc, work)
        if rnd.random() > 0.12:
            continue
        # A failover between two writes: the new owner answers from what replay rebuilt.
        state = svc.ownership.require(p)
        expected = view(state)
        how = rnd.choice(["replay", "compacted", "no tombstones", "snapshot"])
        if how == "snapshot":
            assert await snapshot_view(state, offset_log) == expected
        elif how != "replay":
            log = compacted(offset_log, p, drop_tombstones=how == "no tombstones")
            assert await replayed_view(data_log, log, settings, p) == expected, how
        old_work = work
        svc, work = await work_node(data_log, offset_log, settings)
        nodes.append(svc)
        failovers += 1
        got = view(svc.ownership.require(p))
        assert got == expected, _diff(got, expected)
        if rnd.random() < 0.5:
            # The old owner, a zombie now, leases on after the new owner wrote: its grants
            # are lost, their tokens refused by the new owner even where it grants the same
            # attempt, and its writes (keys beside the new owner's) never override the new
            # owner's, compacted or not.
            await history.step(svc, work)
            zombie = (await old_work.lease(QUEUE, CONSUMER, 3, 60_000, 0)).records
            state = svc.ownership.require(p)
            work_state = state.windows[(QUEUE, CONSUMER)]
            for r in zombie:
                off = r.record.offset
                if off < (state.committed(QUEUE, CONSUMER) or 0) or off in work_state.done:
                    continue  # done here: completing it again is idempotent
                for call in (work.complete(QUEUE, CONSUMER, [r.token]),
                             work.extend(QUEUE, CONSUMER, [r.token], 60_000),
                             work.retry(QUEUE, CONSUMER, [r.token], 0, None)):
                    with pytest.raises(VQError) as err:
                        await call
                    assert err.value.code == "lease_expired"
            current = view(svc.ownership.require(p))
            assert await replayed_view(data_log, offset_log, settings, p) == current
            log = compacted(offset_log, p, drop_tombstones=rnd.random() < 0.5)
            assert await replayed_view(data_log, log, settings, p) == current
    assert failovers >= 10
    final = view(svc.ownership.require(p))
    assert await replayed_view(data_log, compacted(offset_log, p, True), settings, p) == final
    for n in nodes:
        n.close()


@pytest.mark.parametrize("seed", range(10))
async def test_a_failover_with_grants_written_behind_costs_at_most_the_documented(clock, seed):
    """The owner answers leases, their grant writes still in flight, and dies: the new owner
    has every record as the last write that landed left it. So each record of a lost grant is
    leasable again at once with its attempt count one lower, the lost tokens are refused, and
    everything else (completions, retries, extensions, which were answered once written) is
    exactly as the old owner had it. Deliveries of a record exceed `max_attempts` by at most
    the failovers that lost one of its grants."""
    rnd = random.Random(7000 + seed)
    settings = Settings(write_visible_timeout_ms=1000, max_lease_window=40)
    data_log, offset_log = MemoryLog(), MemoryLog()
    svc, work = await work_node(data_log, offset_log, settings)
    max_attempts = 3
    await work.configure(QUEUE, CONSUMER, "lease", max_attempts, "h-dlq", None)
    p = svc.partition_of(QUEUE)
    history = History(rnd, clock)
    nodes = [svc]
    lost_grants: Counter[int] = Counter()  # per record, grants a failover lost
    lossy = 0
    for _ in range(200):
        await history.step(svc, work)
        if rnd.random() > 0.15:
            continue
        state = svc.ownership.require(p)
        written = view(state)  # every write so far has landed
        offset_log.hold = True  # the next writes stay in flight, and the owner dies
        behind = []
        for _ in range(rnd.randint(1, 3)):
            try:  # a lease that must wait for a write (dead letters) never answers
                got = await asyncio.wait_for(
                    work.lease(QUEUE, CONSUMER, rnd.randint(1, 4), 60_000, 0), 0.05)
            except TimeoutError:
                break
            for r in got.records:
                history.delivered[r.record.offset] += 1
            behind += got.records
        await offset_log.crash()
        svc, work = await work_node(data_log, offset_log, settings)
        nodes.append(svc)
        after = view(svc.ownership.require(p))
        # Everything is as the last write that landed left it: every completion, retry and
        # extension answered before; each record of a lost grant is available again, its
        # attempt count one lower than the lost delivery's.
        assert after == written, _diff(after, written)
        lost = {r.record.offset: r.attempt for r in behind}
        lossy += bool(lost)
        for off, attempt in lost.items():
            lost_grants[off] += 1
            now = after[2][off]
            assert now == "new" if attempt == 1 else (isinstance(now, tuple)
                                                      and now[2] == attempt - 1), (off, now)
        state = svc.ownership.require(p)
        window = state.windows[(QUEUE, CONSUMER)]
        for r in behind:
            off = r.record.offset
            if off < (state.committed(QUEUE, CONSUMER) or 0) or off in window.done:
                continue
            with pytest.raises(VQError) as err:  # its grant was never written
                await work.extend(QUEUE, CONSUMER, [r.token], 60_000)
            assert err.value.code == "lease_expired"
        history.drop([r.token for r in behind])
    assert lossy >= 5
    for off, n in history.delivered.items():
        assert n <= max_attempts + lost_grants[off], (off, n, lost_grants[off])
    final = view(svc.ownership.require(p))
    assert await replayed_view(data_log, compacted(offset_log, p, True), settings, p) == final
    for n in nodes:
        n.close()


async def test_an_offset_log_in_adr_8s_format_replays_and_is_taken_over(clock):
    """Records written by the per-record format of ADR 8 (one entry per delivery) replay,
    their tokens stay current, and the first write checkpoints and clears their keys."""
    settings = Settings(write_visible_timeout_ms=1000)
    data_log, offset_log = MemoryLog(), MemoryLog()
    svc, work = await work_node(data_log, offset_log, settings)
    offsets = await fill(svc, QUEUE, 4, key=None)
    await work.configure(QUEUE, CONSUMER, "lease", 5, None, None)
    state = svc.ownership.require(svc.partition_of(QUEUE))
    p = state.partition
    old = [DeliveryUpdated(QUEUE, CONSUMER, offsets[0], 1, clock.now + 60_000, True),
           DeliveryUpdated(QUEUE, CONSUMER, offsets[1], 0, 0, False, True),
           DeliveryUpdated(QUEUE, CONSUMER, offsets[2], 2, clock.now + 60_000, False, False,
                           None, "later")]
    await offset_log.append(p, [(*encode_offset_entry(e), generation_header(state.generation))
                                for e in old])
    svc.close()
    svc, work = await work_node(data_log, offset_log, settings)
    state = svc.ownership.require(p)
    assert state.windows[(QUEUE, CONSUMER)].legacy
    _, _, records = view(state)
    assert records[offsets[1]] == "done" and records[offsets[3]] == "new"
    assert records[offsets[2]][:3] == (False, clock.now + 60_000, 2)
    got = (await work.lease(QUEUE, CONSUMER, 10, 60_000, 0)).records
    assert [r.record.offset for r in got] == [offsets[3]]
    # The old owner's token (no grant in it) completes the record it leased.
    assert (await work.complete(QUEUE, CONSUMER, [f"{offsets[0]}.1"])).done
    expected = view(state)
    assert not state.windows[(QUEUE, CONSUMER)].legacy
    latest = {k: v for k, v, _ in offset_log.partitions[p]}
    assert not [k for k, v in latest.items() if known(k).startswith(b'["r"') and v is not None]
    assert await replayed_view(data_log, compacted(offset_log, p, True), settings, p) == \
        expected
    svc.close()


def _diff(a, b):
    return {k: (a[2].get(k), b[2].get(k)) for k in set(a[2]) | set(b[2])
            if a[2].get(k) != b[2].get(k)}, a[:2], b[:2]
