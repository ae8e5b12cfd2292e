"""The async client: routes each call to the node that owns the queue's partition."""

from __future__ import annotations

import asyncio
import io
import json as jsonlib
import random
import time
from collections import deque
from typing import Any
from urllib.parse import quote

import aiohttp

from vqueues_client.encoding import (
    checked_pairs,
    decode_record,
    encode_for_many,
    encode_item,
    error_from,
    name_error,
    named_record,
    renamed,
)
from vqueues_client.errors import DeadlineExceeded, VQError
from vqueues_client.transport import Transport
from vqueues_client.types import (
    EnqueueResult,
    Lease,
    LeasePage,
    NewRecord,
    ReadResult,
    RecordResult,
    Refused,
    Value,
)

_UNSET: Any = object()
# A prefix consumer's figures that each node gives for its own partitions.
_COUNTS = ("queues", "ready_queues", "in_flight", "backlog")


class AsyncClient(Transport):
    """`async with AsyncClient(["http://node1:8080"]) as vq: await vq.enqueue("q", ["x"])`.

    `token` is sent as a bearer token on every call; `ca_file` verifies https:// nodes whose
    certificates a private CA signed. The cluster map is fetched from any of `urls`, cached,
    and refreshed on a 409 wrong_node, on a connection error, on an answer from a partition
    past the map's count, and every `refresh_interval_s`.
    Retriable failures are retried with exponential backoff and jitter until `deadline_s`.
    """

    @staticmethod
    def _q(queue: str) -> str:
        return quote(queue, safe="")

    # The API -----------------------------------------------------------------------------------

    async def enqueue(self, queue: str,
                      values: list[Value | NewRecord] | Value | NewRecord,
                      headers: dict[str, str] | None = None, *,
                      idempotency_key: str | None = None,
                      tags: list[str] | None = None, deliver_at: int | None = None,
                      delay_ms: int | None = None) -> EnqueueResult:
        """Enqueue one value or a list, in one request and in this order; `bytes` go base64,
        `str` as UTF-8. `headers` apply to plain values; a `NewRecord` carries its own.

        A retried enqueue (after a connection error) may write twice: at-least-once, unless
        the records carry idempotency keys (`idempotency_key` for a single value, or
        `NewRecord(..., idempotency_key=...)` per record): then the automatic retry is safe.
        """
        items = values if isinstance(values, list) else [values]
        if any(x is not None for x in (idempotency_key, tags, deliver_at, delay_ms)):
            if len(items) != 1 or isinstance(items[0], NewRecord):
                raise ValueError("idempotency_key=, tags=, deliver_at= and delay_ms= are for "
                                 "one plain value; give each NewRecord its own")
            items = [NewRecord(items[0], headers, idempotency_key, tags, deliver_at, delay_ms)]
        body = await self._call("POST", queue, f"/v1/queues/{self._q(queue)}/records",
                                json={"records": [encode_item(v, headers) for v in items]})
        return EnqueueResult(body["partition"], body["offsets"])

    async def enqueue_many(self, records: list[tuple[str, Value | NewRecord]], *,
                           deadline_s: float | None = None) -> list[RecordResult]:
        """Enqueue records to many queues: one `POST /v1/records` per owner node (in calls of
        at most `max_records_per_call` records and `max_body_bytes` bytes, the node's limits),
        the owners in parallel. Records that fail retriably (`wrong_node`: the map is
        refreshed and they go to the new owner; a partition moving or replaying; a broker
        error; a lost connection; no node answering) are sent again, before any later record
        of their queue, until `deadline_s`. Each queue's records keep their order. Returns
        one result per record, in order; a record that failed for good has `error` set
        (nothing is raised for it): a bad queue name or a value over `max_record_bytes`
        before anything is sent; a record a node refuses the whole call for (a 400 or 413
        naming it) alone, named `records[i]` by its place in `records`, the call's other
        records sent again. A call refused as too large is split and sent again. Raises for
        a refusal of a whole call that names no record (401, 403, 415...)."""
        deadline = time.monotonic() + (self.deadline_s if deadline_s is None else deadline_s)
        pairs = checked_pairs(records)
        queues = [q for q, _ in pairs]
        encoded = [encode_for_many(q, v) for q, v in pairs]
        results: list[RecordResult | None] = [None] * len(pairs)
        last: dict[int, VQError] = {}
        todo: list[int] = []
        for i, q in enumerate(queues):
            bad = name_error(q, f"records[{i}].queue")
            if bad is None:
                todo.append(i)
            else:
                results[i] = RecordResult(q, -1, None, bad)
        delay = self.backoff_initial_s
        while todo:
            try:
                await self._fresh_map()
            except VQError as exc:  # no node answers: wait and ask again, until the deadline
                if not exc.retriable:
                    raise
                last.update(dict.fromkeys(todo, exc))
            else:
                fit = []
                for i in todo:
                    bad = self.size_error(f"records[{i}]", *encoded[i])
                    if bad is None:
                        fit.append(i)
                    else:
                        results[i] = RecordResult(queues[i], self._partition_of(queues[i]),
                                                  None, bad)
                by_owner: dict[str, list[int]] = {}
                for i in fit:
                    by_owner.setdefault(self.cached_owner(queues[i]), []).append(i)
                rounds = await asyncio.gather(*(
                    self._enqueue_at(url, queues, encoded, indices, results, last)
                    for url, indices in by_owner.items()))
                todo = sorted(i for retry, _ in rounds for i in retry)
                if not todo:
                    break
                if any(refresh for _, refresh in rounds):
                    await self._refresh_quietly()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for i in todo:
                    q = queues[i]
                    results[i] = RecordResult(q, self._partition_of(q), None,
                                              DeadlineExceeded(last.get(i)))
                break
            if not all(last[i].code == "wrong_node" for i in todo):
                await asyncio.sleep(min(remaining, random.uniform(0, delay)))  # full jitter
                delay = min(self.backoff_max_s, delay * 2)
        return [r for r in results if r is not None]

    async def _enqueue_at(self, url: str, queues: list[str], encoded: list[tuple[bytes, int]],
                          indices: list[int], results: list[RecordResult | None],
                          last: dict[int, VQError]) -> tuple[list[int], bool]:
        """Send `indices` to the node at `url`, in calls within its limits, one after
        another; fill `results`. Returns the indices to send again and whether the map should
        be refreshed. A queue that failed retriably in one call has its later records held
        back for the next round, so they cannot overtake."""
        retry: list[int] = []
        refresh = False
        held: set[str] = set()
        sizes = [len(data) for data, _ in encoded]
        work = deque(self.chunks(indices, sizes))
        while work:
            chunk: list[int] = []
            for i in work.popleft():
                (retry if queues[i] in held else chunk).append(i)
            if not chunk:
                continue
            try:
                answers = await self.post_encoded(url, [encoded[i][0] for i in chunk])
            except VQError as exc:
                if exc.retriable:
                    refresh = refresh or exc.status in (0, 503)
                    for i in chunk:
                        retry.append(i)
                        last[i] = exc
                        held.add(queues[i])
                    continue
                at = named_record(exc, len(chunk))
                if at is None and len(chunk) == 1 and exc.code == "payload_too_large":
                    at = 0
                if at is not None:  # that record fails alone; the others go again
                    i = chunk[at]
                    results[i] = RecordResult(queues[i], self._partition_of(queues[i]), None,
                                              self._in_call(exc, chunk))
                    if len(chunk) > 1:
                        work.appendleft(chunk[:at] + chunk[at + 1:])
                    continue
                if exc.code in ("payload_too_large", "too_many_records"):
                    self.learn_refusal(exc, [sizes[i] for i in chunk])
                    work.extendleft(reversed(self.chunks(chunk, sizes)))
                    continue
                raise
            for i, answer in zip(chunk, answers, strict=True):
                q = queues[i]
                if "error" not in answer:
                    results[i] = RecordResult(q, answer["partition"], answer.get("offset"))
                    continue
                err = error_from(int(answer.get("status", 0)), answer)
                if err.retriable or err.code == "wrong_node":
                    retry.append(i)
                    last[i] = err
                    held.add(q)
                    refresh = refresh or err.code in ("wrong_node", "partition_unavailable")
                else:
                    results[i] = RecordResult(q, answer.get("partition", -1), None,
                                              self._in_call(err, chunk))
        return retry, refresh

    @staticmethod
    def _in_call(err: VQError, chunk: list[int]) -> VQError:
        """`err`, about a call of `chunk`'s records, naming them by their place in the
        caller's list."""
        def ours(k: int) -> int:
            return chunk[k] if 0 <= k < len(chunk) else k
        return renamed(err, lambda k: f"records[{ours(k)}]", ours)

    async def post_records(self, url: str, items: list[dict[str, Any]]
                           ) -> list[dict[str, Any]]:
        """One `POST /v1/records` to one node, not retried: its per-record answers. Raises
        VQError for a refusal of the whole request, or a transport failure (status 0)."""
        return await self.post_encoded(url, [
            jsonlib.dumps(item, separators=(",", ":")).encode() for item in items])

    async def post_encoded(self, url: str, records: list[bytes]) -> list[dict[str, Any]]:
        """`post_records` with each record already encoded (`encode_for_many`): the body is
        exactly `request_bytes` of their sizes."""
        body = b'{"records":[' + b",".join(records) + b"]}"
        try:
            # A file-like body: aiohttp warns of (and writes at once) raw bytes over 1 MiB.
            async with self.session.post(f"{url}/v1/records", data=io.BytesIO(body), headers={
                    **self.headers, "Content-Type": "application/json"}) as r:
                answer = await r.json(content_type=None) if r.content_length != 0 else None
                if r.status >= 300:
                    raise error_from(r.status, answer, r.reason or "")
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise VQError(0, "connection_error", f"{url}: {exc}", retriable=True) from None
        assert isinstance(answer, dict) and isinstance(answer.get("results"), list), answer
        return list(answer["results"])

    async def read(self, queue: str, *, consumer: str | None = None, offset: int | None = None,
                   limit: int | None = None, wait_ms: int | None = None,
                   tag: str | None = None) -> ReadResult:
        params = {k: str(v) for k, v in (("consumer", consumer), ("offset", offset),
                                         ("limit", limit), ("wait_ms", wait_ms), ("tag", tag))
                  if v is not None}
        deadline = self.deadline_s + (wait_ms or 0) / 1000
        body = await self._call("GET", queue, f"/v1/queues/{self._q(queue)}/records",
                                params=params, deadline_s=deadline)
        return ReadResult(body["partition"], [decode_record(r) for r in body["records"]],
                          body["next_offset"])

    async def ack(self, queue: str, consumer: str, offset: int, *,
                  allow_rewind: bool = False) -> dict[str, Any]:
        """Commit `offset`, the consumer's next offset to read."""
        body = await self._call_obj(
            "POST", queue, f"/v1/queues/{self._q(queue)}/consumers/{self._q(consumer)}/ack",
            json={"offset": offset, "allow_rewind": allow_rewind})
        assert body is not None
        return body

    async def cancel_scheduled(self, queue: str, record_id: int) -> dict[str, Any] | None:
        """Cancel a scheduled record (its id: the offset its enqueue answered) before it is
        due; None if it is not waiting any more."""
        return await self._call_obj("DELETE", queue,
                                    f"/v1/queues/{self._q(queue)}/scheduled/{record_id}",
                                    ok404=True)

    async def queue_info(self, queue: str) -> dict[str, Any] | None:
        """The queue's partition, record count, offsets and consumers; None if unknown."""
        return await self._call_obj("GET", queue, f"/v1/queues/{self._q(queue)}", ok404=True)

    async def delete_queue(self, queue: str) -> dict[str, Any] | None:
        """Delete the queue and its consumers; None if it did not exist."""
        return await self._call_obj("DELETE", queue, f"/v1/queues/{self._q(queue)}",
                                    ok404=True)

    async def delete_consumer(self, queue: str, consumer: str) -> dict[str, Any] | None:
        return await self._call_obj(
            "DELETE", queue, f"/v1/queues/{self._q(queue)}/consumers/{self._q(consumer)}",
            ok404=True)

    async def cluster_map(self) -> dict[str, Any]:
        return await self.refresh_map()

    async def list_queues(self, prefix: str = "", *, limit: int | None = None,
                          stats: bool = False) -> list[Any]:
        """Queue names (or, with `stats`, one summary dict each) across the whole cluster,
        sorted by name: every node's listing, paged and merged."""
        out: list[Any] = []
        for url in await self.node_urls():
            after: str | None = None
            while True:
                params = {"prefix": prefix, "limit": "1000", "stats": str(stats).lower()}
                if after is not None:
                    params["after"] = after
                status, body = await self._get_node(url, "/v1/queues", params)
                if status != 200:
                    raise error_from(status, body)
                out.extend(body["stats"] if stats else body["queues"])
                after = body["next_after"]
                if after is None or (limit is not None and len(out) >= limit * 2):
                    break
        out.sort(key=(lambda x: x["queue"]) if stats else (lambda x: x))
        return out if limit is None else out[:limit]

    async def nodes(self) -> list[dict[str, Any]]:
        """Each node's own view: its `/readyz` answer (`status`, `owned`, `ready`, `details`:
        per owned partition its replay progress) or, if it did not answer, `error`."""
        out = []
        for url in await self.node_urls():
            try:
                status, body = await self._get_node(url, "/readyz")
                out.append({"url": url, **body} if isinstance(body, dict)
                           else {"url": url, "error": f"HTTP {status}"})
            except (aiohttp.ClientError, TimeoutError) as exc:
                out.append({"url": url, "status": "unreachable", "error": str(exc)})
        return out

    async def find_offset(self, queue: str, timestamp_ms: int) -> int:
        """The offset of the queue's first record stamped at or after `timestamp_ms` (the
        queue's end if none): a binary search over one-record reads, like Kafka's
        offsets-for-times. Assumes the queue's timestamps do not go back in time."""
        info = await self.queue_info(queue)
        if info is None or info["first_offset"] is None:
            raise VQError(404, "queue_not_found", f"queue {queue!r} has no records")
        lo, hi = int(info["first_offset"]), int(info["last_offset"]) + 1
        end = hi
        while lo < hi:  # the smallest start whose first record is at or after timestamp_ms
            mid = (lo + hi) // 2
            page = await self.read(queue, offset=mid, limit=1)
            if page.records and page.records[0].timestamp < timestamp_ms:
                lo = page.records[0].offset + 1
            else:
                hi = mid
        page = await self.read(queue, offset=lo, limit=1)
        return page.records[0].offset if page.records else end

    # Work queues (docs/work-queues.md) --------------------------------------------------------

    def _c(self, queue: str, consumer: str) -> str:
        return f"/v1/queues/{self._q(queue)}/consumers/{self._q(consumer)}"

    async def configure_consumer(self, queue: str, consumer: str, *, mode: str | None = None,
                                 max_attempts: int | None = None,
                                 dead_letter_queue: str | None = _UNSET,
                                 visibility_ms: int | None = None,
                                 max_in_flight: int | None = _UNSET,
                                 durable_grants: bool | None = None) -> dict[str, Any]:
        """Set a consumer's settings; fields left out keep their value (`dead_letter_queue=None`
        removes the dead-letter queue, `max_in_flight=None` the cap). `durable_grants=True`:
        leases answered only once their grants are written (docs/work-queues.md, "What
        survives a failover")."""
        body: dict[str, Any] = {k: v for k, v in (("mode", mode), ("max_attempts", max_attempts),
                                                  ("visibility_ms", visibility_ms),
                                                  ("durable_grants", durable_grants))
                                if v is not None}
        if dead_letter_queue is not _UNSET:
            body["dead_letter_queue"] = dead_letter_queue
        if max_in_flight is not _UNSET:
            body["max_in_flight"] = max_in_flight
        out = await self._call_obj("PUT", queue, self._c(queue, consumer), json=body)
        assert out is not None
        return out

    async def consumer_settings(self, queue: str, consumer: str) -> dict[str, Any] | None:
        return await self._call_obj("GET", queue, self._c(queue, consumer), ok404=True)

    async def lease(self, queue: str, consumer: str, *, max_records: int = 1,
                    visibility_ms: int | None = None, wait_ms: int = 0,
                    tag: str | None = None,
                    complete: Lease | str | list[Lease] | list[str] | list[Lease | str] |
                    None = None) -> LeasePage[str]:
        """Lease up to `max_records` records no other worker holds (long poll: `wait_ms`).

        `complete`: leases (or tokens) finished since, at most 10,000, completed first in the
        same call, token by token: the answer's `completed` (tokens) and `refused`
        (`Refused`) say what each did. If the call raises, some may have been completed: send
        them again (completing is idempotent). A lease whose answer is lost (a retried call)
        simply expires: its records come again, with the next attempt number."""
        body: dict[str, Any] = {"max_records": max_records, "wait_ms": wait_ms}
        if visibility_ms is not None:
            body["visibility_ms"] = visibility_ms
        if tag is not None:
            body["tag"] = tag
        if complete is not None:
            body["complete"] = self._tokens(complete)
        out = await self._call_obj("POST", queue, self._c(queue, consumer) + "/lease", json=body,
                                   deadline_s=self.deadline_s + wait_ms / 1000)
        assert out is not None
        return LeasePage([Lease(decode_record(r), r["token"], r["attempt"], r["deadline"])
                          for r in out["records"]],
                         [str(t) for t in out.get("completed") or []],
                         [Refused(str(r["token"]), str(r["code"]))
                          for r in out.get("refused") or []])

    @staticmethod
    def _tokens(leases: Lease | str | list[Lease] | list[str] | list[Lease | str]) -> list[str]:
        items = leases if isinstance(leases, list) else [leases]
        return [x.token if isinstance(x, Lease) else x for x in items]

    async def complete(self, queue: str, consumer: str,
                       leases: Lease | str | list[Lease] | list[str] | list[Lease | str]
                       ) -> dict[str, Any]:
        """Finish leased records for good (by Lease or token); 409 `lease_expired` if a lease
        is not current any more (then nothing was done)."""
        out = await self._call_obj("POST", queue, self._c(queue, consumer) + "/complete",
                                   json={"tokens": self._tokens(leases)})
        assert out is not None
        return out

    async def retry(self, queue: str, consumer: str,
                    leases: Lease | str | list[Lease] | list[str] | list[Lease | str], *,
                    delay_ms: int = 0, reason: str | None = None) -> dict[str, Any]:
        """Give leased records back, available again after `delay_ms`; a record that used up
        its attempts goes to the consumer's dead-letter queue instead."""
        body: dict[str, Any] = {"tokens": self._tokens(leases), "delay_ms": delay_ms}
        if reason is not None:
            body["reason"] = reason
        out = await self._call_obj("POST", queue, self._c(queue, consumer) + "/retry", json=body)
        assert out is not None
        return out

    async def extend(self, queue: str, consumer: str,
                     leases: Lease | str | list[Lease] | list[str] | list[Lease | str],
                     visibility_ms: int) -> dict[str, Any]:
        """Move the leases' deadline to now + `visibility_ms`."""
        out = await self._call_obj("POST", queue, self._c(queue, consumer) + "/extend",
                                   json={"tokens": self._tokens(leases),
                                         "visibility_ms": visibility_ms})
        assert out is not None
        return out

    # Prefix consumers: one pool of workers for every queue under a prefix ------------------------

    def _p(self, consumer: str) -> str:
        return f"/v1/prefix-consumers/{self._q(consumer)}"

    async def configure_prefix_consumer(self, consumer: str, prefix: str, *,
                                        max_attempts: int | None = None,
                                        visibility_ms: int | None = None,
                                        dead_letter_queue: str | None = None,
                                        max_in_flight: int | None = None,
                                        weights: dict[str, int] | None = None,
                                        records_per_turn: int | None = None,
                                        durable_grants: bool | None = None
                                        ) -> dict[str, Any]:
        """Define (or redefine) `consumer` over every queue whose name starts with `prefix`
        (docs/work-queues.md); `dead_letter_queue` may hold `{queue}`: one per queue."""
        options = (("max_attempts", max_attempts), ("visibility_ms", visibility_ms),
                   ("dead_letter_queue", dead_letter_queue), ("max_in_flight", max_in_flight),
                   ("weights", weights), ("records_per_turn", records_per_turn),
                   ("durable_grants", durable_grants))
        body: dict[str, Any] = {"prefix": prefix}
        body.update((name, value) for name, value in options if value is not None)
        out = await self._call_obj("PUT", None, self._p(consumer), json=body)
        assert out is not None
        return out

    async def delete_prefix_consumer(self, consumer: str) -> dict[str, Any] | None:
        return await self._call_obj("DELETE", None, self._p(consumer), ok404=True)

    async def prefix_consumers(self) -> list[dict[str, Any]]:
        """Every prefix consumer, with its queues, queues waiting for a turn, records in flight
        and backlog summed over the nodes."""
        merged: dict[str, dict[str, Any]] = {}
        for url in await self.node_urls():
            status, body = await self._get_node(url, "/v1/prefix-consumers")
            if status != 200:
                raise error_from(status, body)
            for info in body["prefix_consumers"]:
                seen = merged.setdefault(info["consumer"], {**info, **dict.fromkeys(_COUNTS, 0)})
                for count in _COUNTS:
                    seen[count] += info[count]
        return [merged[c] for c in sorted(merged)]

    async def lease_prefix(self, consumer: str, node: str, *, max_records: int = 1,
                           visibility_ms: int | None = None, wait_ms: int = 0,
                           complete: list[Lease] | list[tuple[str, str]] |
                           list[Lease | tuple[str, str]] | None = None
                           ) -> LeasePage[tuple[str, str]]:
        """Lease up to `max_records` records from the queues under `consumer`'s prefix that
        `node` (a URL of `node_urls()`) owns, queue by queue in turn. Settle them with the
        same node.

        `complete`: leases from prefix leases of this node, or `(queue, token)` pairs, at
        most 10,000, completed first in the same call, token by token: the answer's
        `completed` (`(queue, token)` pairs) and `refused` (`Refused`, with `queue`; code
        `wrong_node` for a queue this node does not serve) say what each did."""
        body: dict[str, Any] = {"max_records": max_records, "wait_ms": wait_ms}
        if visibility_ms is not None:
            body["visibility_ms"] = visibility_ms
        if complete is not None:
            body["complete"] = self._pairs(complete)
        out = await self._call_node(node, "POST", self._p(consumer) + "/lease", json=body,
                                    deadline_s=self.deadline_s + wait_ms / 1000)
        return LeasePage([Lease(decode_record(r), r["token"], r["attempt"], r["deadline"],
                                r["queue"], r["partition"]) for r in out["records"]],
                         [(str(t["queue"]), str(t["token"])) for t in out.get("completed") or []],
                         [Refused(str(r["token"]), str(r["code"]), str(r["queue"]))
                          for r in out.get("refused") or []])

    @staticmethod
    def _pairs(leases: list[Lease] | list[tuple[str, str]] | list[Lease | tuple[str, str]]
               ) -> list[dict[str, str]]:
        out = []
        for x in leases:
            if isinstance(x, Lease):
                if x.queue is None:
                    raise ValueError("prefix calls take leases from a prefix lease (they name "
                                     "a queue)")
                out.append({"queue": x.queue, "token": x.token})
            else:
                queue, token = x
                out.append({"queue": queue, "token": token})
        return out

    async def complete_prefix(self, consumer: str, node: str, leases: list[Lease]
                              ) -> dict[str, Any]:
        """Complete leases of many queues at once; all or nothing (409 `lease_expired` names
        every stale one as {"queue", "token"})."""
        return await self._call_node(node, "POST", self._p(consumer) + "/complete",
                                     json={"tokens": self._pairs(leases)})

    async def retry_prefix(self, consumer: str, node: str, leases: list[Lease], *,
                           delay_ms: int = 0, reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"tokens": self._pairs(leases), "delay_ms": delay_ms}
        if reason is not None:
            body["reason"] = reason
        return await self._call_node(node, "POST", self._p(consumer) + "/retry", json=body)

    async def extend_prefix(self, consumer: str, node: str, leases: list[Lease],
                            visibility_ms: int) -> dict[str, Any]:
        return await self._call_node(node, "POST", self._p(consumer) + "/extend",
                                     json={"tokens": self._pairs(leases),
                                           "visibility_ms": visibility_ms})
