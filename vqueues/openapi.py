"""The OpenAPI 3.1 document served at GET /v1/openapi.json (limits filled from Settings)."""

from __future__ import annotations

from typing import Any

from vqueues import __version__
from vqueues.names import MAX_NAME_BYTES
from vqueues.settings import Settings


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _ok(schema: str, description: str = "OK") -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": _ref(schema)}}}


_ERR = {"description": "error", "content": {"application/json": {"schema": _ref("Error")}}}


def openapi_document(s: Settings) -> dict[str, Any]:
    name = {"type": "string", "minLength": 1,
            "description": f"1 to {MAX_NAME_BYTES} UTF-8 bytes, no control characters; "
                           "URL-encode `/` as %2F"}
    queue_p = {"name": "queue", "in": "path", "required": True, "schema": name}
    consumer_p = {"name": "consumer", "in": "path", "required": True, "schema": name}
    errors = {"400": _ERR, "409": _ERR, "503": _ERR}
    return {
        "openapi": "3.1.0",
        "info": {"title": "vqueues", "version": __version__,
                 "description": "Very many named queues on one Kafka topic. Every error is "
                                "{\"error\": {\"code\", \"message\"}}; 409 `wrong_node` means "
                                "another node owns the queue's partition; 503 carries "
                                "Retry-After."},
        "paths": {
            "/v1/queues/{queue}/records": {
                "post": {
                    "summary": "Enqueue records (answered after the broker acknowledged them)",
                    "parameters": [queue_p],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": _ref("EnqueueRequest")}}},
                    "responses": {"200": _ok("EnqueueResponse"), "413": _ERR, **errors},
                },
                "get": {
                    "summary": "Read records from the explicit offset, the consumer's committed "
                               "offset, or the queue's first retained record",
                    "parameters": [
                        queue_p,
                        {"name": "consumer", "in": "query", "schema": name},
                        {"name": "offset", "in": "query",
                         "schema": {"type": "integer", "minimum": 0}},
                        {"name": "limit", "in": "query",
                         "schema": {"type": "integer", "minimum": 1, "maximum": s.max_read_limit,
                                    "default": s.default_read_limit}},
                        {"name": "wait_ms", "in": "query",
                         "schema": {"type": "integer", "minimum": 0, "maximum": s.max_wait_ms,
                                    "default": 0}},
                        {"name": "encoding", "in": "query",
                         "schema": {"enum": ["utf8", "base64"], "default": "utf8"}},
                    ],
                    "responses": {"200": _ok("ReadResponse"), **errors},
                },
            },
            "/v1/queues/{queue}/consumers/{consumer}/ack": {
                "post": {
                    "summary": "Commit the consumer's next offset to read (durable)",
                    "parameters": [queue_p, consumer_p],
                    "requestBody": {"required": True, "content": {"application/json": {
                        "schema": _ref("AckRequest")}}},
                    "responses": {"200": _ok("AckResponse"), **errors},
                },
            },
            "/v1/queues/{queue}/consumers/{consumer}": {
                "delete": {"summary": "Delete a consumer", "parameters": [queue_p, consumer_p],
                           "responses": {"200": _ok("Object"), "404": _ERR, **errors}},
            },
            "/v1/queues/{queue}": {
                "get": {"summary": "A queue's partition, records, offsets and consumers' lag",
                        "parameters": [queue_p],
                        "responses": {"200": _ok("QueueInfo"), "404": _ERR, **errors}},
                "delete": {"summary": "Delete the queue and its consumers",
                           "parameters": [queue_p],
                           "responses": {"200": _ok("Object"), "404": _ERR, **errors}},
            },
            "/v1/queues": {
                "get": {"summary": "Queues held by this node",
                        "parameters": [
                            {"name": "prefix", "in": "query", "schema": {"type": "string"}},
                            {"name": "after", "in": "query", "schema": {"type": "string"}},
                            {"name": "limit", "in": "query",
                             "schema": {"type": "integer", "minimum": 1,
                                        "maximum": s.max_list_queues, "default": 1000}}],
                        "responses": {"200": _ok("Object")}},
            },
            "/v1/partitions": {"get": {"summary": "Partition count and this node's partitions",
                                       "responses": {"200": _ok("Object")}}},
            "/v1/openapi.json": {"get": {"summary": "This document",
                                         "responses": {"200": _ok("Object")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (text format)",
                                 "responses": {"200": {"description": "metrics"}}}},
            "/healthz": {"get": {"summary": "Liveness", "responses": {"200": _ok("Object")}}},
            "/readyz": {"get": {"summary": "Ready when every owned partition is replayed",
                                "responses": {"200": _ok("Object"), "503": _ok("Object")}}},
        },
        "components": {"schemas": {
            "Object": {"type": "object"},
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"],
                "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
            "EnqueueRequest": {"type": "object", "required": ["records"], "properties": {
                "records": {"type": "array", "minItems": 1, "maxItems": s.max_batch_records,
                            "items": {"type": "object", "required": ["value"],
                                      "additionalProperties": False, "properties": {
                                          "value": {"type": ["string", "null"],
                                                    "description": "at most "
                                                    f"{s.max_record_bytes} bytes decoded"},
                                          "encoding": {"enum": ["utf8", "base64"],
                                                       "default": "utf8"},
                                          "headers": {"type": "object",
                                                      "additionalProperties":
                                                          {"type": "string"}}}}}}},
            "EnqueueResponse": {"type": "object", "properties": {
                "partition": {"type": "integer"},
                "offsets": {"type": ["array", "null"], "items": {"type": "integer"},
                            "description": "null when the node writes with acks=0"}}},
            "Record": {"type": "object", "properties": {
                "offset": {"type": "integer"}, "timestamp": {"type": "integer"},
                "value": {"type": ["string", "null"]},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "encoding": {"enum": ["base64"], "description": "present when a value that is "
                             "not UTF-8 was returned base64-encoded"}}},
            "ReadResponse": {"type": "object", "properties": {
                "partition": {"type": "integer"},
                "records": {"type": "array", "items": _ref("Record")},
                "next_offset": {"type": "integer"}}},
            "AckRequest": {"type": "object", "required": ["offset"], "properties": {
                "offset": {"type": "integer", "minimum": 0},
                "allow_rewind": {"type": "boolean", "default": False}}},
            "AckResponse": {"type": "object", "properties": {
                "queue": {"type": "string"}, "consumer": {"type": "string"},
                "offset": {"type": "integer"},
                "previous_offset": {"type": ["integer", "null"]}}},
            "QueueInfo": {"type": "object", "properties": {
                "queue": {"type": "string"}, "partition": {"type": "integer"},
                "records": {"type": "integer"},
                "first_offset": {"type": ["integer", "null"]},
                "last_offset": {"type": ["integer", "null"]},
                "consumers": {"type": "array", "items": {"type": "object", "properties": {
                    "consumer": {"type": "string"}, "offset": {"type": "integer"},
                    "lag": {"type": "integer"}}}}}},
        }},
    }
