"""Group commit on the offset topic: one write in flight per partition, the writes made
meanwhile go out together as the next, in order (ADR 12)."""

import asyncio

import pytest

from vqueues.queues.offset_writer import OffsetWriter
from vqueues.storage import Delivered, Outgoing

pytestmark = pytest.mark.unit


class SlowLog:
    """Acknowledges each submission when the test says so; records what was submitted."""

    def __init__(self) -> None:
        self.submitted: list[tuple[int, list[Outgoing]]] = []
        self.pending: list[tuple[asyncio.Future[list[Delivered]], list[Delivered]]] = []
        self.written: dict[int, list[Outgoing]] = {}
        self.refuse = False

    def submit(self, partition, records):
        if self.refuse:
            raise BufferError("full")
        self.submitted.append((partition, list(records)))
        fut = asyncio.get_running_loop().create_future()
        log = self.written.setdefault(partition, [])
        first = len(log)
        log.extend(records)
        self.pending.append((fut, [(first + i, 0) for i in range(len(records))]))
        return fut

    def ack_all(self, exc=None):
        pending, self.pending = self.pending, []
        for fut, delivered in pending:
            if exc is None:
                fut.set_result(delivered)
            else:
                fut.set_exception(exc)


async def test_writes_made_while_one_is_in_flight_share_the_next_submission():
    log = SlowLog()
    writer = OffsetWriter(log)
    first = writer.submit(0, [(b"a", b"1", None)])
    waiting = [writer.submit(0, [(b"k", str(i).encode(), None)] * 2) for i in range(10)]
    other = writer.submit(1, [(b"b", b"1", None)])  # another partition: not held back
    assert [p for p, _ in log.submitted] == [0, 1]
    log.ack_all()
    assert await first == [(0, 0)]
    await asyncio.sleep(0)  # the delivery callback sends what waited, as one submission
    assert [p for p, _ in log.submitted] == [0, 1, 0] and len(log.submitted[2][1]) == 20
    assert await other == [(0, 0)]
    log.ack_all()
    results = await asyncio.gather(*waiting)
    assert results == [[(1 + 2 * i, 0), (2 + 2 * i, 0)] for i in range(10)]
    # Their records went in the order they were submitted.
    assert [v for _, v, _ in log.written[0][1:]] == [str(i).encode() for i in range(10)
                                                     for _ in range(2)]
    assert writer.writes == 3


async def test_a_failed_write_fails_every_write_it_carried_and_the_next_goes_on():
    log = SlowLog()
    writer = OffsetWriter(log)
    first = writer.submit(0, [(b"a", b"1", None)])
    second = writer.submit(0, [(b"a", b"2", None)])
    log.ack_all(RuntimeError("broker down"))
    with pytest.raises(RuntimeError):
        await first
    await asyncio.sleep(0)
    log.ack_all(RuntimeError("still down"))
    with pytest.raises(RuntimeError):
        await second
    third = writer.submit(0, [(b"a", b"3", None)])
    log.ack_all()
    assert await third == [(2, 0)]  # the fake counts failed writes too


async def test_a_refused_write_to_an_idle_partition_fails_at_once():
    log = SlowLog()
    log.refuse = True
    with pytest.raises(BufferError):
        OffsetWriter(log).submit(0, [(b"a", b"1", None)])
