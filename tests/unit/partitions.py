"""A partition's state for the unit tier: records and states made in a line, random histories
for the replay checks (retention, snapshots), and what a reader can observe. Plain helpers."""

import random
from typing import Any

from vqueues.records import ConsumerAcked, ConsumerDeleted, QueueDeleted, Record
from vqueues.state.cache import RecordCache
from vqueues.state.partition_state import PartitionState


def rec(offset, value=b"v"):
    """A data record at `offset`."""
    return Record(offset, 1, value, ())


def state_with(records):
    """Partition 0's state with `records` ((queue, record) pairs) indexed."""
    s = PartitionState(0, RecordCache(1 << 20))
    s.apply_records(records, high_watermark=None)
    return s


def observe(s: PartitionState):
    """Everything a reader can observe of a partition's state."""
    return ({name: (q.offsets.tolist(), dict(q.consumers), q.deleted_before)
             for name, q in s.queues.items()}, list(s.names))


def history(seed: int, queues: int = 12, steps: int = 600):
    """A random interleaving of data records and offset-topic entries, in log order."""
    rnd = random.Random(seed)
    names = [f"q{i}" for i in range(queues)]
    events: list[tuple[Any, ...]] = []
    offset = 0
    for _ in range(steps):
        roll = rnd.random()
        q = rnd.choice(names)
        if roll < 0.7:
            events.append(("data", q, offset))
            offset += 1
        elif roll < 0.85:
            events.append(("entry", ConsumerAcked(q, rnd.choice("xyz"), rnd.randrange(offset + 1),
                                                  rnd.randrange(1, 100))))
        elif roll < 0.93:
            events.append(("entry", ConsumerDeleted(q, rnd.choice("xyz"))))
        else:
            events.append(("entry", QueueDeleted(q, offset)))
    return events, offset
