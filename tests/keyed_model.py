"""A model of idempotent (keyed) enqueue as docs/api.md states it, and random keyed requests to
check a node against it: shared by the unit tier (tests/unit/queues/test_idempotency_model.py,
in memory) and the real-broker tier (tests/test_idempotency_model.py, node processes)."""

import json
import random
from typing import Any

from vqueues.hashing import partition_for

QUEUES = ("orders", "mail", "jobs")


class KeyModel:
    """The documented rule: within the window a key of a queue maps to the first record sent
    with it; a repeat with the same payload (value, headers, tags, schedule as given) answers
    its offset, another payload is refused, and a refused request writes nothing."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions  # offsets are a partition's
        self.first: dict[tuple[str, str], tuple[str, int]] = {}  # (queue, key) -> (payload, offset)

    @staticmethod
    def payload(record: dict[str, Any]) -> str:
        return json.dumps({k: v for k, v in record.items() if k != "idempotency_key"},
                          sort_keys=True)

    def expect(self, queue: str, records: list[dict[str, Any]]
               ) -> tuple[dict[str, Any] | None, list[Any]]:
        """(the refusal expected, or None; per record the offset expected: an int, a new
        key's ("new", key), or ("same", index) for a repeat within the request)."""
        out: list[Any] = []
        in_request: dict[str, tuple[int, str]] = {}
        for i, record in enumerate(records):
            key, payload = record["idempotency_key"], self.payload(record)
            known = self.first.get((queue, key))
            if known is not None:
                if known[0] != payload:
                    return {"index": i, "first_offset": known[1]}, []
                out.append(known[1])
            elif key in in_request:
                first, first_payload = in_request[key]
                if first_payload != payload:
                    return {"index": i, "first_index": first}, []
                out.append(("same", first))
            else:
                in_request[key] = (i, payload)
                out.append(("new", key))
        return None, out

    def check(self, queue: str, records: list[dict[str, Any]], answer: dict[str, Any]) -> None:
        """An answer against the model; the new keys are learnt."""
        refusal, expected = self.expect(queue, records)
        if refusal is not None:
            error = answer.get("error")
            assert error is not None, (records, answer, refusal)
            assert error["code"] == "idempotency_key_reused" and error["index"] == refusal["index"]
            if "first_offset" in refusal:
                assert error["first_offset"] == refusal["first_offset"]
            else:
                assert error["first_index"] == refusal["first_index"]
            return
        assert "error" not in answer, (records, answer, self.first)
        offsets = answer["offsets"]
        p = partition_for(queue, self.partitions)
        taken = {o for (q, _), (_, o) in self.first.items()
                 if partition_for(q, self.partitions) == p}
        for i, (want, got) in enumerate(zip(expected, offsets, strict=True)):
            if isinstance(want, int):
                assert got == want, (i, records, offsets)
            elif want[0] == "same":
                assert got == offsets[want[1]], (i, records, offsets)
            else:
                assert got not in taken, (i, records, offsets)
                self.first[(queue, want[1])] = (self.payload(records[i]), got)


class Requests:
    """Random keyed enqueue requests in the API's JSON shape: often sent again unchanged, keys
    often sent again with their first record in another request, new keys all along."""

    def __init__(self, rng: random.Random, now_ms) -> None:
        self.rng, self.now_ms = rng, now_ms
        self.sent: list[tuple[str, list[dict[str, Any]]]] = []
        self.due: dict[str, int] = {}  # key -> the deliver_at it was first sent with
        # (queue, key) -> the record first sent
        self.first: dict[tuple[str, str], dict[str, Any]] = {}

    def record(self, key: str, queue: str = "") -> dict[str, Any]:
        rng = self.rng
        known = self.first.get((queue, key))
        if known is not None and rng.random() < 0.6:
            return dict(known)  # the same record again, in another request
        record: dict[str, Any] = {"value": rng.choice(["a", "b"]), "idempotency_key": key}
        if rng.random() < 0.2:
            record["headers"] = {"h": rng.choice(["1", "2"])}
        if rng.random() < 0.15:
            record["tags"] = [rng.choice(["red", "blue"])]
        roll = rng.random()
        if roll < 0.25:  # due soon after it is first sent: retries come before and after
            due = self.due.setdefault(key, self.now_ms() + rng.choice([30, 80, 200]))
            record["deliver_at"] = due if rng.random() < 0.9 else due + 1
        elif roll < 0.45:
            record["delay_ms"] = rng.choice([50, 5_000])
        return record

    def next(self) -> tuple[str, list[dict[str, Any]]]:
        rng = self.rng
        if self.sent and rng.random() < 0.4:
            return rng.choice(self.sent)  # a retry, as sent
        queue = rng.choice(QUEUES)
        pool = 8 + len(self.sent) // 4  # new keys keep coming
        keys = [f"k{rng.randrange(pool)}" for _ in range(rng.randint(1, 4))]
        records = [self.record(k, queue) for k in keys]
        if rng.random() < 0.2:  # a key repeated within the request, as sent or not
            records.append(dict(records[0]) if rng.random() < 0.5 else self.record(keys[0]))
        for record in records:
            self.first.setdefault((queue, record["idempotency_key"]), record)
        self.sent.append((queue, records))
        return queue, records
