"""Dead letters: records past `max_attempts` are written to the consumer's dead-letter queue
(with headers naming where they came from) and then completed, counted in the consumer's
committed offset entry (docs/work-queues.md). At least once: a crash in between writes them
again on the next try."""

from __future__ import annotations

from vqueues.names import fitted_name
from vqueues.queues.entry_writer import EntryWriter
from vqueues.queues.record_reader import RecordReader
from vqueues.queues.service import QueueService
from vqueues.records import now_ms
from vqueues.state.consumer_config import ConsumerConfig
from vqueues.state.partition_state import PartitionState
from vqueues.state.window_writes import WindowWrite

# A dead-lettering in progress holds its records this long (in memory only: a crash redoes it).
DEAD_LETTER_HOLD_MS = 60_000


class DeadLetters:
    """Moves exhausted records of a lease consumer to its dead-letter queue."""

    def __init__(self, queues: QueueService, entries: EntryWriter, reader: RecordReader) -> None:
        self.queues = queues
        self.entries = entries
        self.reader = reader

    async def send(self, state: PartitionState, queue: str, consumer: str,
                   config: ConsumerConfig, reasons: dict[int, str]) -> None:
        """Write the records to the dead-letter queue (through the producer, wherever its
        partition is owned), then complete them here, counted. Called under the consumer's
        lock."""
        work = state.windows[(queue, consumer)]
        offsets = sorted(reasons)
        hold = now_ms() + DEAD_LETTER_HOLD_MS
        for off in offsets:  # nobody leases them meanwhile (in memory only)
            d = work.deliveries.get(off)
            if d is not None:
                work.put(off, True, hold, d.attempts, d.grant, d.reason, now_ms())
        records = await self.reader.resolve(state.partition, offsets)
        # A name stored before long ones were shortened is shortened the same way here.
        dlq = fitted_name(config.dead_letter_queue) if config.dead_letter_queue else None
        if dlq and records:
            attempts = {o: work.deliveries[o].attempts for o in offsets if o in work.deliveries}
            out = []
            for rec in records:
                headers = [(k, v) for k, v in rec.headers if v is not None]
                headers += [("vq-dlq-source-queue", queue.encode()),
                            ("vq-dlq-source-offset", str(rec.offset).encode()),
                            ("vq-dlq-consumer", consumer.encode()),
                            ("vq-dlq-attempts", str(attempts.get(rec.offset, 0)).encode()),
                            ("vq-dlq-reason", reasons[rec.offset].encode())]
                out.append((rec.value, headers))
            ownership = self.queues.ownership
            target = ownership.states.get(self.queues.partition_of(dlq))
            await self.queues.append_records(
                dlq, out, target if target is not None and target.ready.is_set() else None)
        if state.revoked or state.windows.get((queue, consumer)) is not work:
            return  # the partition or the consumer went meanwhile
        write = WindowWrite(state, queue, consumer, work)
        write.finish(offsets, dead=len(offsets))
        await self.entries.submit(state, write.entries(), applied=True)
        self.queues.metrics.records_dead_lettered.inc(len(offsets))
