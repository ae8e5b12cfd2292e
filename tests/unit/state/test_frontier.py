"""The frontier: records are indexed in offset order, once, whichever path brings them first."""

from vqueues.records import Record
from vqueues.state.frontier import Frontier


class Recorder:
    """What a frontier asks to be indexed, in order."""

    def __init__(self):
        self.indexed = []
        self.frontier = Frontier(self.one, self.many)

    def one(self, queue, rec, woken):
        self.indexed.append((queue, rec.offset))
        woken.add(queue)

    def many(self, queue, records, woken):
        self.indexed.extend((queue, r.offset) for r in records)
        woken.add(queue)
        return True


def rec(offset, headers=()):
    return Record(offset, 1, b"v", headers)


def test_the_tail_indexes_in_order_and_a_refetch_is_ignored():
    r = Recorder()
    woken: set[str] = set()
    r.frontier.tail([("a", rec(0)), ("a", rec(1)), ("b", rec(3))], woken)
    r.frontier.tail([("a", rec(1)), ("b", rec(4))], woken)
    assert r.indexed == [("a", 0), ("a", 1), ("b", 3), ("b", 4)] and woken == {"a", "b"}
    assert r.frontier.next_offset == r.frontier.tail_offset == 5


def test_an_own_write_behind_a_gap_waits_for_the_tail_to_fill_it():
    r = Recorder()
    r.frontier.own("a", [rec(1), rec(2)], set())
    assert r.indexed == [] and set(r.frontier.waiting) == {1, 2}
    r.frontier.tail([("b", rec(0))], set())  # another producer's record fills the gap
    assert r.indexed == [("b", 0), ("a", 1), ("a", 2)] and not r.frontier.waiting
    assert r.frontier.own_indexed == {1, 2} and r.frontier.next_offset == 3
    r.frontier.tail([("a", rec(1)), ("a", rec(2))], set())  # the tail confirms them
    assert len(r.indexed) == 3 and not r.frontier.own_indexed


def test_a_tail_that_gets_there_first_indexes_the_own_write_itself():
    r = Recorder()
    r.frontier.own("a", [rec(1)], set())
    r.frontier.tail([("b", rec(0)), ("a", rec(1))], set())
    assert r.indexed == [("b", 0), ("a", 1)] and not r.frontier.own_indexed


def test_a_run_at_the_frontier_is_recognised_and_recorded():
    r = Recorder()
    assert r.frontier.at_run([rec(0), rec(1), rec(2)])
    assert not r.frontier.at_run([rec(0)])  # one record: the common path
    assert not r.frontier.at_run([rec(1), rec(2)])  # not at the frontier
    assert not r.frontier.at_run([rec(0), rec(2)])  # not consecutive
    assert r.frontier.at_run([rec(0), rec(1, (("h", b"x"),))])  # headers: the callee's
    r.frontier.ran(0, 2)
    assert r.frontier.next_offset == 3 and r.frontier.own_indexed == {0, 1, 2}
    r.frontier.own("a", [rec(4)], set())
    assert not r.frontier.at_run([rec(3), rec(4)])  # another own write waits


def test_skipping_moves_both_positions_and_drains_what_waited():
    r = Recorder()
    r.frontier.own("a", [rec(5)], set())
    woken: set[str] = set()
    assert r.frontier.skip_to(5, woken)
    assert r.indexed == [("a", 5)] and woken == {"a"} and r.frontier.next_offset == 6
    assert r.frontier.tail_offset == 5 and not r.frontier.skip_to(5, set())


def test_starting_at_a_snapshots_position_skips_what_lies_below():
    r = Recorder()
    r.frontier.start_at(10)
    r.frontier.tail([("a", rec(9)), ("a", rec(10))], set())
    assert r.indexed == [("a", 10)]
