"""`POST /v1/records`: the multi-queue enqueue (vqueues/queues/multi_enqueue.py over HTTP).

A request that is wrong as a whole (not JSON, too many records, a record without a queue or
with a bad field) is refused before anything is written. Otherwise every record is answered on
its own: `{"queue", "partition", "offset"}`, or `{"queue", "partition", "error"}` with the
registry's error (wrong_node naming the owner, partition_unavailable, forbidden,
quota_exceeded, a broker error...). With `--forward`, the records of partitions another node
owns are sent on to it in one request per owner, once.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from vqueues.api.answers import respond
from vqueues.api.body import decode_object, read_raw, refuse_unknown
from vqueues.api.enqueue_body import decode_records
from vqueues.api.keys import AUTH, IDENTITY, PROXY, QUOTAS, SERVICE, SETTINGS
from vqueues.api.proxy import FORWARDED
from vqueues.errors import BadRequest, Unavailable, VQError, WrongNode
from vqueues.names import validate_name
from vqueues.queues import multi_enqueue
from vqueues.records import NewRecord


def quota_refusal(request: web.Request, queue: str,
                  records: Sequence[NewRecord]) -> Unavailable | None:
    """Charge `records` to the quota of `queue`'s prefix; the refusal if it is used up."""
    quotas = request.app.get(QUOTAS)
    if quotas is None:
        return None
    nbytes = sum(len(v or b"") + sum(len(k) + len(h) for k, h in hs) for v, hs in records)
    refused = quotas.quotas.charge(queue, len(records), nbytes)
    if refused is None:
        return None
    request.app[SERVICE].metrics.quota_refusals.labels(refused.prefix).inc()
    return Unavailable("quota_exceeded", f"the enqueue quota of prefix {refused.prefix!r} "
                       f"({refused.limit}) is used up; retry in {refused.retry_after_s} s",
                       retry_after_s=refused.retry_after_s, prefix=refused.prefix,
                       limit=refused.limit)


def _decode(raw: bytes, max_records: int) -> tuple[list[dict[str, Any]], list[str]]:
    """The request's records (each without its queue) and their queues, checked."""
    body = decode_object(raw)
    refuse_unknown(body, ("records",))
    items = body.get("records")
    if not isinstance(items, list) or not items:
        raise BadRequest("invalid_records", "body must have a non-empty array `records`")
    if len(items) > max_records:
        raise BadRequest("too_many_records", f"at most {max_records} records per request, got "
                         f"{len(items)}", max=max_records)
    queues: list[str] = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("queue"), str):
            raise BadRequest("invalid_record", f"records[{i}] must be an object with `queue` "
                             "(a string) and `value`")
        queues.append(validate_name(item["queue"], f"records[{i}].queue"))
    return items, queues


async def enqueue_many(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    items, queues = _decode(await read_raw(request), settings.max_batch_records)
    records = decode_records({"records": [{k: v for k, v in item.items() if k != "queue"}
                                          for item in items]}, settings)
    identity = request.get(IDENTITY) if AUTH in request.app else None

    def check(queue: str, queue_records: Sequence[NewRecord]) -> VQError | None:
        if identity is not None and not identity.allows("write", queue):
            return VQError("forbidden", f"token {identity.name!r} has no 'write' scope on queue "
                           f"{queue!r}", scope="write")
        return quota_refusal(request, queue, queue_records)

    service = request.app[SERVICE]
    outcomes = await multi_enqueue.enqueue_many(service, list(zip(queues, records, strict=True)),
                                                check)
    results: list[dict[str, Any]] = []
    for queue, outcome in zip(queues, outcomes, strict=True):
        if isinstance(outcome, VQError):
            results.append({"queue": queue, "partition": service.partition_of(queue),
                            "status": outcome.status, **outcome.to_json()})
        else:
            results.append({"queue": queue, "partition": outcome[0], "offset": outcome[1]})
    if settings.forward and FORWARDED not in request.headers:
        await _forward(request, items, outcomes, results)
    failed = sum(1 for r in results if "error" in r)
    return respond({"results": results, "written": len(results) - failed, "failed": failed})


async def _forward(request: web.Request, items: list[dict[str, Any]],
                   outcomes: Sequence[multi_enqueue.Outcome], results: list[dict[str, Any]]
                   ) -> None:
    """Send the records another node owns on to it (one request per owner, their order kept)
    and put its answers in their places."""
    by_owner: dict[str, list[int]] = {}
    for i, outcome in enumerate(outcomes):
        if isinstance(outcome, WrongNode) and outcome.details.get("owner"):
            by_owner.setdefault(str(outcome.details["owner"]), []).append(i)
    headers = {k: v for k, v in request.headers.items()
               if k.lower() in ("authorization", "x-request-id")}
    headers[FORWARDED] = request.app[SETTINGS].effective_node_id
    for owner, indices in by_owner.items():
        try:
            async with request.app[PROXY].post(
                    f"{owner}/v1/records", json={"records": [items[i] for i in indices]},
                    headers=headers) as resp:
                answer = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            error = Unavailable("owner_unreachable", f"forwarding to {owner} failed: {exc}",
                                owner=owner).to_json()
            for i in indices:
                results[i] = {**results[i], "status": 503, **error}
            continue
        theirs = answer.get("results") if isinstance(answer, dict) else None
        for n, i in enumerate(indices):
            if isinstance(theirs, list) and n < len(theirs):
                results[i] = _in_this_request(theirs[n], indices)
            elif isinstance(answer, dict) and "error" in answer:  # refused as a whole
                results[i] = _in_this_request({
                    "queue": results[i]["queue"], "partition": results[i]["partition"],
                    "status": resp.status, "error": answer["error"]}, indices)


_RECORD = re.compile(r"records\[(\d+)\]")


def _in_this_request(result: Any, indices: list[int]) -> Any:
    """An owner's answer for one of the records forwarded to it (or for all of them, when it
    refused them as a whole), its error's record indices (`index`, `first_index`,
    `records[n]` in the message) turned from the forwarded request's into this request's
    (`indices`: this request's index of each forwarded record)."""
    error = result.get("error") if isinstance(result, dict) else None
    if not isinstance(error, dict):
        return result

    def ours(n: int) -> int:
        return indices[n] if 0 <= n < len(indices) else n

    error = dict(error)
    for name in ("index", "first_index"):
        if type(error.get(name)) is int:
            error[name] = ours(error[name])
    if isinstance(error.get("message"), str):
        error["message"] = _RECORD.sub(lambda m: f"records[{ours(int(m[1]))}]",
                                       error["message"])
    return {**result, "error": error}
