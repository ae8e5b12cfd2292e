"""The data producer on a real broker: writes under load share produce requests through a
lingering second producer, a write to an idle producer goes out through the first, and either
way each send's records land in order, every one acknowledged."""

import asyncio

from tests.support import create_topics, kafka_records
from vqueues.kafka.producer import AsyncProducer


async def test_overlapping_sends_share_the_lingering_producer_and_keep_each_sends_order(
        bootstrap):
    t = create_topics(bootstrap, partitions=2)
    producer = AsyncProducer({"bootstrap.servers": bootstrap, "acks": "all",
                              "enable.idempotence": True, "linger.ms": 0}, "test",
                             busy_linger_ms=20)
    try:
        # One at a time: nothing else in flight, so the first producer takes each.
        for i in range(3):
            await producer.send(t.data, 0, [(b"q", f"lone-{i}".encode(), None)])
        assert producer.busy_sends == 0

        def headers(n: int, i: int) -> list[tuple[str, bytes]] | None:
            """Odd sends: runs without headers between records with them (each goes alone,
            the runs in one call), a header on the first and last record of some."""
            return [("h", b"%d" % i)] if n % 2 == 1 and i % (n + 2) in (0, 3) else None

        def records(n: int) -> list[tuple[bytes, bytes, list[tuple[str, bytes]] | None]]:
            return [(b"q", f"s{n}-{i}".encode(), headers(n, i)) for i in range(50)]

        sends = [producer.send(t.data, 0, records(n)) for n in range(8)]
        results = await asyncio.gather(*sends)
        assert producer.busy_sends == 7  # all but the first overlapped another send
        for acked in results:
            offsets = [o for o, _ in acked]
            assert offsets == sorted(offsets) and len(set(offsets)) == 50
            assert all(ts > 0 for _, ts in acked)
        everything = sorted(o for acked in results for o, _ in acked)
        assert everything == list(range(3, 3 + 8 * 50))  # every record acknowledged, once
        on_broker = kafka_records(bootstrap, t.data)
        assert len(on_broker) == 3 + 8 * 50
        for n, acked in enumerate(results):
            assert [on_broker[(0, o)][1] for o, _ in acked] == [f"s{n}-{i}".encode()
                                                                for i in range(50)]
            assert [on_broker[(0, o)][3] for o, _ in acked] == [
                tuple(headers(n, i) or ()) for i in range(50)]
    finally:
        await asyncio.to_thread(producer.close)


async def test_without_a_busy_linger_there_is_one_producer(bootstrap):
    t = create_topics(bootstrap, partitions=1)
    producer = AsyncProducer({"bootstrap.servers": bootstrap, "linger.ms": 5}, "test",
                             busy_linger_ms=5)  # not above linger.ms: no second producer
    try:
        results = await asyncio.gather(*(producer.send(t.data, 0, [(b"q", b"v", None)])
                                         for _ in range(4)))
        assert sorted(o for acked in results for o, _ in acked) == [0, 1, 2, 3]
        assert producer.busy_sends == 0
    finally:
        await asyncio.to_thread(producer.close)
