"""The OpenAPI 3.1 document served at GET /v1/openapi.json.

Query parameters come from `params` (the same specs that validate requests), answer schemas
from the service's result types (msgspec derives them), request-body limits and the error codes
from Settings and the error registry: nothing here can drift from what the node does.
"""

from __future__ import annotations

from typing import Any

import msgspec

from vqueues import __version__
from vqueues.api import params
from vqueues.api.answers import LeasePage, PrefixLeasePage, ReadPage
from vqueues.api.auth import required_scope
from vqueues.api.work import MAX_RIDING_TOKENS
from vqueues.errors import REGISTRY
from vqueues.names import MAX_NAME_BYTES, NAME_PATTERN
from vqueues.results import (
    AckResult,
    ConsumerDeletion,
    ConsumerSettings,
    EnqueueResult,
    PartitionsInfo,
    PrefixConsumerInfo,
    PrefixSettleResult,
    QueueDeletion,
    QueueInfo,
    QueueList,
    ScheduledCancellation,
    SettleResult,
)
from vqueues.settings import MIN_VISIBILITY_MS, Settings
from vqueues.state.idempotency import MAX_KEY_BYTES
from vqueues.state.prefix_consumers import (
    MAX_RECORDS_PER_TURN,
    MAX_WEIGHT,
    MAX_WEIGHTS,
    RECORDS_PER_TURN,
)
from vqueues.state.tags import MAX_TAG_BYTES, MAX_TAGS, TAG_PATTERN
from vqueues.state.tokens import TOKEN_PATTERN
from vqueues.work.consumer_configs import MAX_ATTEMPTS_LIMIT
from vqueues.work.work_service import MAX_REASON_CHARS

_ANSWERS = (EnqueueResult, ReadPage, AckResult, ConsumerDeletion, QueueInfo, QueueDeletion,
            QueueList, PartitionsInfo, ConsumerSettings, LeasePage, SettleResult,
            ScheduledCancellation, PrefixConsumerInfo, PrefixLeasePage, PrefixSettleResult)
_TEMPLATE = "#/components/schemas/{name}"
# A name's maxLength counts characters, the node UTF-8 bytes: a name of 249 characters
# beyond ASCII is longer than the node takes, which JSON Schema cannot say.
_NAME = {"type": "string", "minLength": 1, "maxLength": MAX_NAME_BYTES,
         "pattern": NAME_PATTERN,
         "description": f"1 to {MAX_NAME_BYTES} UTF-8 bytes, no control characters"}
_TOKEN = {"type": "string", "pattern": TOKEN_PATTERN,
          "description": "a lease token, as a lease answered it (opaque)"}
_TOKENS = {"type": "array", "minItems": 1, "items": _TOKEN}
_TAG = {"type": "string", "minLength": 1, "maxLength": MAX_TAG_BYTES, "pattern": TAG_PATTERN,
        "description": f"at most {MAX_TAG_BYTES} UTF-8 bytes, no commas or surrounding spaces"}
_PREFIX_TOKENS = {"type": "array", "minItems": 1, "items": {
    "type": "object", "required": ["queue", "token"], "additionalProperties": False,
    "properties": {"queue": _NAME, "token": _TOKEN}}}
# A longer reason is cut, not refused.
_REASON = {"type": ["string", "null"],
           "description": f"why; its first {MAX_REASON_CHARS} characters are kept (a dead "
                          "letter carries the last one)"}
# What base64.b64decode(validate=True) takes: the standard alphabet, padded.
_BASE64_PATTERN = "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"
_TAG_PARAM = {"name": "tag", "in": "query", "schema": _TAG,
              "description": "only records carrying this tag (from the tag index)"}


_DURABLE_GRANTS = {"type": ["boolean", "null"], "default": False,
                   "description": "(lease) answer a lease only once its grants are written to "
                                  "the offset topic (false: written behind the answer; "
                                  "docs/work-queues.md, What survives a failover)"}

def _ref(name: str) -> dict[str, str]:
    return {"$ref": _TEMPLATE.format(name=name)}


def _ok(schema: str, description: str = "OK") -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ref(schema)}}}


_ERR = {"description": "error (see the Error schema for every code)",
        "content": {"application/json": {"schema": _ref("Error")}}}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying",
                                "schema": {"type": "integer", "minimum": 0}}}
_ERR_LATER = {**_ERR, "headers": _RETRY_AFTER}
_BODY_ERRORS = {
    "408": {**_ERR, "description": "request_timeout: the body did not arrive within "
                                   "body_timeout_ms (retriable; the connection is closed)"},
    "413": {**_ERR, "description": "payload_too_large or record_too_large"},
    "415": {**_ERR, "description": "unsupported_media_type: Content-Type is not JSON, or "
                                   "Content-Encoding is not gzip, deflate or identity"}}
_BODY_NOTE = ("JSON (application/json, or any application/*+json; UTF-8), optionally "
              "Content-Encoding gzip or deflate. Strict: no field the schema does not list, no "
              "key twice, nesting at most 32 deep (docs/api.md, 'Request bodies').")


def _body(schema: str, required: bool = True) -> dict[str, Any]:
    return {"required": required, "description": _BODY_NOTE,
            "content": {"application/json": {"schema": _ref(schema)}}}


def _secured(paths: dict[str, Any], s: Settings) -> dict[str, Any]:
    """Each operation as the node enforces it: the bearer token it needs (with auth on;
    with auth off one is accepted and not needed) and 401/403 where it needs one; 408, 413
    and 415 where it takes a body; Retry-After on 429 and 503."""
    for path, operations in paths.items():
        for method, op in operations.items():
            responses = op["responses"]
            need = required_scope(path, method.upper())
            if need == "metrics" and not s.metrics_auth:
                need = None
            if need is None:
                op["security"] = []
            else:
                op["security"] = [{"bearer": []}] if s.auth else [{}, {"bearer": []}]
                responses.setdefault("401", {**_ERR, "description": "unauthenticated (auth "
                                             "on): no valid bearer token"})
                if need not in ("any", "metrics"):
                    responses.setdefault("403", {**_ERR, "description": "forbidden (auth "
                                                 f"on): the token has no {need!r} scope on "
                                                 "this queue"})
            if "requestBody" in op:
                for code, answer in _BODY_ERRORS.items():
                    responses.setdefault(code, answer)
            if path not in PROBES:
                responses.setdefault("400", {**_ERR, "description": "invalid_parameter: a "
                                             "query parameter this route does not take, or "
                                             "one given twice"})
            for code in ("429", "503"):
                if code in responses:
                    responses[code] = {**responses[code], "headers": _RETRY_AFTER}
    return paths


# Liveness and readiness probes take any query: a prober's own parameters never fail them.
PROBES = ("/healthz", "/readyz")


def query_parameters(document: dict[str, Any]) -> dict[tuple[str, str], frozenset[str]]:
    """The query parameters each documented route takes, by (path template, METHOD): the node
    refuses any other (the probes aside), as a body's unknown fields are refused."""
    return {(path, method.upper()): frozenset(p["name"] for p in op.get("parameters", ())
                                              if p["in"] == "query")
            for path, operations in document["paths"].items() if path not in PROBES
            for method, op in operations.items()}


def _request_schemas(s: Settings) -> dict[str, Any]:
    lease = {"max_records": params.LEASE_MAX_RECORDS.body_schema(s),
             "visibility_ms": params.LEASE_VISIBILITY_MS.body_schema(s),
             "wait_ms": params.LEASE_WAIT_MS.body_schema(s),
             "encoding": {"enum": ["utf8", "base64"], "default": "utf8"}}
    record: dict[str, Any] = {
        "type": "object", "required": ["value"], "additionalProperties": False, "properties": {
            "value": {"type": ["string", "null"],
                      "description": f"at most {s.max_record_bytes} bytes decoded"},
            "encoding": {"enum": ["utf8", "base64"], "default": "utf8"},
            "headers": {"type": ["object", "null"], "additionalProperties": {"type": "string"}},
            "deliver_at": {"type": ["integer", "null"], "minimum": -(2**63),
                           "maximum": params.MAX_OFFSET,
                           "description": "UTC epoch ms: invisible until then (past: at "
                           "once); at most "
                           f"{s.max_schedule_delay_ms} ms ahead"},
            "delay_ms": {"type": ["integer", "null"], "minimum": 0,
                         "maximum": s.max_schedule_delay_ms,
                         "description": "invisible for this long (not with deliver_at)"},
            "tags": {"type": ["array", "null"], "maxItems": MAX_TAGS, "items": _TAG},
            "idempotency_key": {
                "type": ["string", "null"], "minLength": 1, "maxLength": MAX_KEY_BYTES,
                "description": "at most 256 UTF-8 bytes; a repeat within "
                f"idempotency_window_ms ({s.idempotency_window_ms} ms) with the same value, "
                "headers, tags and schedule as given answers the first offset and writes "
                "nothing; with another payload, 409 idempotency_key_reused"}},
        # deliver_at or delay_ms, not both; a base64 value is base64.
        "not": {"required": ["deliver_at", "delay_ms"], "properties": {
            "deliver_at": {"type": "integer"}, "delay_ms": {"type": "integer"}}},
        "if": {"required": ["encoding"], "properties": {"encoding": {"const": "base64"}}},
        "then": {"properties": {"value": {"type": ["string", "null"],
                                          "pattern": _BASE64_PATTERN}}}}
    return {
        "EnqueueRequest": {"type": "object", "required": ["records"],
                           "additionalProperties": False, "properties": {
            "records": {"type": "array", "minItems": 1, "maxItems": s.max_batch_records,
                        "items": record}}},
        "MultiEnqueueRequest": {"type": "object", "required": ["records"],
                                "additionalProperties": False, "properties": {
            "records": {"type": "array", "minItems": 1, "maxItems": s.max_batch_records,
                        "items": {**record, "required": ["queue", "value"], "properties": {
                            "queue": _NAME,
                            **record["properties"]}}}}},
        "MultiEnqueueResult": {"type": "object", "required": ["results", "written", "failed"],
                               "properties": {
            "results": {"type": "array", "description": "one per record, in the order sent",
                        "items": {"type": "object", "required": ["queue", "partition"],
                                  "properties": {
                "queue": {"type": "string"},
                "partition": {"type": "integer"},
                "offset": {"type": ["integer", "null"],
                           "description": "written (null with producer acks 0)"},
                "status": {"type": "integer",
                           "description": "not written: the HTTP status of `error`"},
                "error": {"type": "object", "required": ["code", "message", "retriable"],
                          "description": "not written: the registry's error (wrong_node "
                                         "names `owner` and `owner_node`)"}}}},
            "written": {"type": "integer"},
            "failed": {"type": "integer"}}},
        "AckRequest": {"type": "object", "required": ["offset"], "additionalProperties": False,
                       "properties": {
            "offset": {"type": "integer", "minimum": 0, "maximum": params.MAX_OFFSET},
            "allow_rewind": {"type": "boolean", "default": False}}},
        "ConsumerSettingsRequest": {"type": "object", "additionalProperties": False,
                                    "properties": {
            "mode": {"enum": ["cursor", "lease", None]},
            "max_attempts": {"type": ["integer", "null"], "minimum": 1,
                             "maximum": MAX_ATTEMPTS_LIMIT, "default": s.default_max_attempts},
            "dead_letter_queue": {**_NAME, "type": ["string", "null"],
                                  "description": "a queue name; null: none (records past "
                                                 "max_attempts are counted and skipped)"},
            "visibility_ms": {"type": ["integer", "null"], "minimum": MIN_VISIBILITY_MS,
                              "maximum": s.max_visibility_ms,
                              "default": s.default_visibility_ms},
            "max_in_flight": {"type": ["integer", "null"], "minimum": 1,
                              "maximum": s.max_lease_window,
                              "description": "(lease) records leased at once, at most; null: "
                                             "no cap"},
            "prefix": {**_NAME, "type": ["string", "null"],
                       "description": "the prefix of the prefix consumer by this name that "
                                      "covers the queue: take its settings and follow it "
                                      "again (no other setting beside it)"},
            "durable_grants": _DURABLE_GRANTS}},
        "LeaseRequest": {"type": "object", "additionalProperties": False, "properties": {
            **lease,
            "tag": {**_TAG, "type": ["string", "null"],
                    "description": "lease only records with this tag; new "
                    "records without it are completed as skipped"},
            "complete": {"type": ["array", "null"], "maxItems": MAX_RIDING_TOKENS,
                         "items": {"type": "string"},
                         "description": "tokens to complete first, token by token, in the same "
                                        "write as the grants; the answer's `completed` and "
                                        "`refused` say what each did"}}},
        "PrefixLeaseRequest": {"type": "object", "additionalProperties": False,
                               "properties": {
            **lease,
            "complete": {"type": ["array", "null"], "maxItems": MAX_RIDING_TOKENS,
                         "items": {"type": "object", "required": ["queue", "token"],
                                   "additionalProperties": False,
                                   "properties": {"queue": _NAME, "token": {"type": "string"}}},
                         "description": "{queue, token} pairs to complete first, token by "
                                        "token, each partition's in the same write as its "
                                        "grants; the answer's `completed` and `refused` say "
                                        "what each did"}}},
        "TokensRequest": {"type": "object", "required": ["tokens"], "additionalProperties": False,
                          "properties": {
            "tokens": _TOKENS}},
        "RetryRequest": {"type": "object", "required": ["tokens"], "additionalProperties": False,
                         "properties": {
            "tokens": _TOKENS,
            "delay_ms": params.RETRY_DELAY_MS.body_schema(s),
            "reason": _REASON}},
        "ExtendRequest": {"type": "object", "required": ["tokens", "visibility_ms"],
                          "additionalProperties": False, "properties": {
            "tokens": _TOKENS,
            "visibility_ms": params.LEASE_VISIBILITY_MS.body_schema(s, nullable=False)}},
        "PrefixConsumerRequest": {"type": "object", "required": ["prefix"],
                                  "additionalProperties": False, "properties": {
            "prefix": {**_NAME,
                       "description": "every queue whose name starts with it, now or later"},
            "max_attempts": {"type": ["integer", "null"], "minimum": 1,
                             "maximum": MAX_ATTEMPTS_LIMIT, "default": s.default_max_attempts},
            "visibility_ms": {"type": ["integer", "null"], "minimum": MIN_VISIBILITY_MS,
                              "maximum": s.max_visibility_ms,
                              "default": s.default_visibility_ms},
            "dead_letter_queue": {**_NAME, "type": ["string", "null"],
                                  "description": "a queue name, or one with {queue} in it (one "
                                                 "per queue, e.g. dead-{queue}; one over 249 "
                                                 "bytes is shortened); never under the prefix; "
                                                 "null: none"},
            "max_in_flight": {"type": ["integer", "null"], "minimum": 1,
                              "maximum": s.max_lease_window,
                              "description": "records of one queue leased at once, at most"},
            "durable_grants": _DURABLE_GRANTS,
            "records_per_turn": {"type": ["integer", "null"], "minimum": 1,
                                 "maximum": MAX_RECORDS_PER_TURN, "default": RECORDS_PER_TURN,
                                 "description": "records a queue gives in its turn (times its "
                                                "weight)"},
            "weights": {"type": ["object", "null"], "maxProperties": MAX_WEIGHTS,
                        "additionalProperties": {"type": "integer", "minimum": 1,
                                                 "maximum": MAX_WEIGHT},
                        "description": "queue (under the prefix) -> records per turn "
                                       "(default 1)"}}},
        "PrefixTokensRequest": {"type": "object", "required": ["tokens"],
                                "additionalProperties": False, "properties": {
            "tokens": _PREFIX_TOKENS}},
        "PrefixRetryRequest": {"type": "object", "required": ["tokens"],
                               "additionalProperties": False, "properties": {
            "tokens": _PREFIX_TOKENS,
            "delay_ms": params.RETRY_DELAY_MS.body_schema(s),
            "reason": _REASON}},
        "PrefixExtendRequest": {"type": "object", "required": ["tokens", "visibility_ms"],
                                "additionalProperties": False, "properties": {
            "tokens": _PREFIX_TOKENS,
            "visibility_ms": params.LEASE_VISIBILITY_MS.body_schema(s, nullable=False)}},
        "Error": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message", "retriable"],
            "properties": {"code": {"enum": sorted(REGISTRY)}, "message": {"type": "string"},
                           "retriable": {"type": "boolean"}}}}},
        "Object": {"type": "object"},
    }


def openapi_document(s: Settings) -> dict[str, Any]:
    name = {**_NAME,
            "description": f"1 to {MAX_NAME_BYTES} UTF-8 bytes, no control characters; "
                           "URL-encode `/` as %2F"}
    queue_p = {"name": "queue", "in": "path", "required": True, "schema": name}
    consumer_p = {"name": "consumer", "in": "path", "required": True, "schema": name}
    errors = {"400": _ERR, "409": _ERR, "503": _ERR_LATER}
    _, answers = msgspec.json.schema_components(_ANSWERS, ref_template=_TEMPLATE)
    return {
        "openapi": "3.1.0",
        "info": {"title": "vqueues", "version": __version__,
                 "description": "Very many named queues on one Kafka topic. Every error is "
                                "{\"error\": {\"code\", \"message\", \"retriable\"}}; 409 "
                                "`wrong_node` means another node owns the queue's partition; "
                                "503 carries Retry-After."},
        "paths": _secured({
            "/v1/queues/{queue}/records": {
                "post": {
                    "summary": "Enqueue records (answered after the broker acknowledged them)",
                    "parameters": [queue_p],
                    "requestBody": _body("EnqueueRequest"),
                    "responses": {"200": _ok("EnqueueResult"), "429": _ERR, **errors},
                },
                "get": {
                    "summary": "Read records from the explicit offset, the consumer's committed "
                               "offset, or the queue's first retained record",
                    "parameters": [
                        queue_p,
                        {"name": "consumer", "in": "query", "schema": name},
                        params.READ_OFFSET.openapi(s),
                        params.READ_LIMIT.openapi(s),
                        params.READ_WAIT_MS.openapi(s),
                        _TAG_PARAM,
                        {"name": "encoding", "in": "query",
                         "schema": {"enum": ["utf8", "base64"], "default": "utf8"}},
                    ],
                    "responses": {"200": _ok("ReadPage"), **errors},
                },
            },
            "/v1/records": {
                "post": {
                    "summary": "Enqueue records to many queues: each record names its queue and "
                               "is answered on its own (written, or the registry's error: "
                               "wrong_node naming the owner, ...); a queue's records keep "
                               "their order and succeed or fail together",
                    "requestBody": _body("MultiEnqueueRequest"),
                    "responses": {"200": _ok("MultiEnqueueResult"), "400": _ERR},
                },
            },
            "/v1/queues/{queue}/consumers/{consumer}/ack": {
                "post": {
                    "summary": "Commit the consumer's next offset to read (durable)",
                    "parameters": [queue_p, consumer_p],
                    "requestBody": _body("AckRequest"),
                    "responses": {"200": _ok("AckResult"), **errors},
                },
            },
            "/v1/queues/{queue}/consumers/{consumer}": {
                "delete": {"summary": "Delete a consumer", "parameters": [queue_p, consumer_p],
                           "responses": {"200": _ok("ConsumerDeletion"), "404": _ERR,
                                         **errors}},
                "put": {"summary": "Set a consumer's settings (absent fields keep their value)",
                        "parameters": [queue_p, consumer_p],
                        "requestBody": _body("ConsumerSettingsRequest"),
                        "responses": {"200": _ok("ConsumerSettings"), **errors}},
                "get": {"summary": "A consumer's settings and committed offset",
                        "parameters": [queue_p, consumer_p],
                        "responses": {"200": _ok("ConsumerSettings"), "404": _ERR, **errors}},
            },
            "/v1/queues/{queue}/consumers/{consumer}/lease": {"post": {
                "summary": "Lease records no other worker holds, lowest offset first, one per "
                           "ordering key at a time (long poll with wait_ms)",
                "parameters": [queue_p, consumer_p],
                "requestBody": _body("LeaseRequest", required=False),
                "responses": {"200": _ok("LeasePage"), **errors}}},
            "/v1/queues/{queue}/consumers/{consumer}/complete": {"post": {
                "summary": "Finish leased records for good (all tokens, or 409 and none)",
                "parameters": [queue_p, consumer_p], "requestBody": _body("TokensRequest"),
                "responses": {"200": _ok("SettleResult"), **errors}}},
            "/v1/queues/{queue}/consumers/{consumer}/retry": {"post": {
                "summary": "Give leased records back, available after delay_ms; past "
                           "max_attempts they go to the dead-letter queue",
                "parameters": [queue_p, consumer_p], "requestBody": _body("RetryRequest"),
                "responses": {"200": _ok("SettleResult"), **errors}}},
            "/v1/queues/{queue}/consumers/{consumer}/extend": {"post": {
                "summary": "Move leases' deadline to now + visibility_ms",
                "parameters": [queue_p, consumer_p], "requestBody": _body("ExtendRequest"),
                "responses": {"200": _ok("SettleResult"), **errors}}},
            "/v1/queues/{queue}/consumers/{consumer}/stream": {"get": {
                "summary": "WebSocket: records pushed under credit; complete/retry/extend "
                           "(lease) or ack (cursor) on the socket; a lease stream's credit "
                           "frame may carry `complete` (tokens, answered token by token once "
                           "written) (docs/work-queues.md)",
                "parameters": [queue_p, consumer_p,
                               {"name": "mode", "in": "query",
                                "schema": {"enum": ["cursor", "lease"]}},
                               params.LEASE_VISIBILITY_MS.openapi(s), _TAG_PARAM,
                               {"name": "encoding", "in": "query",
                                "schema": {"enum": ["utf8", "base64"], "default": "utf8"}}],
                "responses": {"101": {"description": "switching to the WebSocket protocol"},
                              **errors}}},
            "/v1/queues/{queue}/scheduled/{id}": {"delete": {
                "summary": "Cancel a scheduled record before it is due",
                "parameters": [queue_p, {"name": "id", "in": "path", "required": True,
                                         "schema": {"type": "integer", "minimum": 0,
                                                    "maximum": params.MAX_OFFSET},
                                         "description": "the offset its enqueue answered"}],
                "responses": {"200": _ok("ScheduledCancellation"), "404": _ERR, **errors}}},
            "/v1/queues/{queue}": {
                "get": {"summary": "A queue's partition, records, offsets and consumers' lag",
                        "parameters": [queue_p],
                        "responses": {"200": _ok("QueueInfo"), "404": _ERR, **errors}},
                "delete": {"summary": "Delete the queue and its consumers",
                           "parameters": [queue_p],
                           "responses": {"200": _ok("QueueDeletion"), "404": _ERR, **errors}},
            },
            "/v1/queues": {
                "get": {"summary": "Queues held by this node",
                        "parameters": [
                            {"name": "prefix", "in": "query", "schema": {"type": "string"}},
                            {"name": "after", "in": "query", "schema": {"type": "string"}},
                            params.LIST_LIMIT.openapi(s),
                            {"name": "stats", "in": "query",
                             "schema": {"enum": ["true", "false"], "default": "false"},
                             "description": "true: also `stats`, one summary per listed queue "
                                            "(records, offsets, consumers, worst lag)"}],
                        "responses": {"200": _ok("QueueList"), "400": _ERR}},
            },
            "/v1/prefix-consumers": {"get": {
                "summary": "Every prefix consumer, with this node's queues, queues waiting for "
                           "a turn and records in flight",
                "responses": {"200": _ok("Object")}}},
            "/v1/prefix-consumers/{consumer}": {
                "put": {"summary": "Define a lease consumer over every queue under a prefix "
                                   "(for the whole cluster; docs/work-queues.md)",
                        "parameters": [consumer_p],
                        "requestBody": _body("PrefixConsumerRequest"),
                        "responses": {"200": _ok("PrefixConsumerInfo"), **errors}},
                "get": {"summary": "A prefix consumer, with this node's figures",
                        "parameters": [consumer_p],
                        "responses": {"200": _ok("PrefixConsumerInfo"), "404": _ERR,
                                      **errors}},
                "delete": {"summary": "Stop leasing across the prefix (each queue's consumer "
                                      "stays)",
                           "parameters": [consumer_p],
                           "responses": {"200": _ok("PrefixConsumerInfo"), "404": _ERR,
                                         **errors}},
            },
            "/v1/prefix-consumers/{consumer}/lease": {"post": {
                "summary": "Lease records from the queues under the prefix in this node's "
                           "partitions, queue by queue in turn (long poll with wait_ms)",
                "parameters": [consumer_p],
                "requestBody": _body("PrefixLeaseRequest", required=False),
                "responses": {"200": _ok("PrefixLeasePage"), "404": _ERR, **errors}}},
            "/v1/prefix-consumers/{consumer}/complete": {"post": {
                "summary": "Finish leased records of many queues (all, or 409 and none)",
                "parameters": [consumer_p], "requestBody": _body("PrefixTokensRequest"),
                "responses": {"200": _ok("PrefixSettleResult"), "404": _ERR, **errors}}},
            "/v1/prefix-consumers/{consumer}/retry": {"post": {
                "summary": "Give leased records of many queues back",
                "parameters": [consumer_p], "requestBody": _body("PrefixRetryRequest"),
                "responses": {"200": _ok("PrefixSettleResult"), "404": _ERR, **errors}}},
            "/v1/prefix-consumers/{consumer}/extend": {"post": {
                "summary": "Move leases of many queues to now + visibility_ms",
                "parameters": [consumer_p], "requestBody": _body("PrefixExtendRequest"),
                "responses": {"200": _ok("PrefixSettleResult"), "404": _ERR, **errors}}},
            "/v1/partitions": {"get": {"summary": "The cluster map, this node's partitions, "
                                                  "and the limits clients size requests by",
                                       "responses": {"200": _ok("PartitionsInfo")}}},
            "/v1/openapi.json": {"get": {"summary": "This document",
                                         "responses": {"200": _ok("Object")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (text format)",
                                 "parameters": [{
                                     "name": "name[]", "in": "query", "required": False,
                                     "description": "only these samples (repeat it)",
                                     "schema": {"type": "array", "items": {"type": "string"}},
                                     "style": "form", "explode": True}],
                                 "responses": {"200": {"description": "metrics"}}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {
                "200": _ok("Object"),
                "500": _ok("Object", "failed: the group thread stopped, or a partition's "
                                     "snapshot could not be built ({status, error})")}}},
            "/readyz": {"get": {"summary": "Ready when every owned partition is replayed",
                                "responses": {"200": _ok("Object"), "503": _ok("Object")}}},
        }, s),
        "components": {"schemas": {**answers, **_request_schemas(s)},
                       "securitySchemes": {"bearer": {
                           "type": "http", "scheme": "bearer",
                           "description": "required when the node runs with auth on "
                                          f"(now: {'on' if s.auth else 'off'}); a token-file "
                                          "token or a JWT, scopes per queue-name prefix "
                                          "(docs/security.md)"}}},
    }
