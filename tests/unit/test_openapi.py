"""The OpenAPI document says what the node enforces (vqueues/api/openapi.py)."""

import dataclasses

from vqueues.api.openapi import openapi_document
from vqueues.auth import required_scope
from vqueues.settings import Settings

PUBLIC = {("/healthz", "get"), ("/readyz", "get"), ("/v1/openapi.json", "get"),
          ("/metrics", "get")}


def _operations(doc):
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            yield path, method, op


def test_with_auth_on_every_operation_but_the_public_ones_needs_the_bearer_token():
    doc = openapi_document(dataclasses.replace(Settings(), auth=True))
    assert "bearer" in doc["components"]["securitySchemes"]
    for path, method, op in _operations(doc):
        if (path, method) in PUBLIC:
            assert op["security"] == [], path
            assert "401" not in op["responses"], path
            continue
        assert op["security"] == [{"bearer": []}], (path, method)
        assert "401" in op["responses"], (path, method)
        scoped = required_scope(path, method.upper()) not in ("any", "metrics")
        assert ("403" in op["responses"]) == scoped, (path, method)


def test_with_auth_off_a_token_is_optional_and_metrics_can_need_one():
    doc = openapi_document(Settings())
    op = doc["paths"]["/v1/queues/{queue}/records"]["post"]
    assert op["security"] == [{}, {"bearer": []}]
    metrics = openapi_document(dataclasses.replace(Settings(), auth=True, metrics_auth=True))
    assert metrics["paths"]["/metrics"]["get"]["security"] == [{"bearer": []}]


def test_bodies_are_strict_json_with_their_refusals_listed():
    doc = openapi_document(Settings())
    bodies = 0
    for path, method, op in _operations(doc):
        if "requestBody" in op:
            bodies += 1
            assert list(op["requestBody"]["content"]) == ["application/json"], path
            assert {"400", "408", "413", "415"} <= set(op["responses"]), (path, method)
        for code in ("429", "503"):
            if code in op["responses"] and "$ref" in str(op["responses"][code]):
                assert "Retry-After" in op["responses"][code].get("headers", {}), (path, code)
    assert bodies == 13
    schemas = doc["components"]["schemas"]
    for name, schema in schemas.items():
        if name.endswith("Request"):
            assert schema.get("additionalProperties") is False, name
    assert "tag" not in schemas["PrefixLeaseRequest"]["properties"]
