"""The OpenAPI document says what the node enforces (vqueues/api/openapi.py)."""

import dataclasses
import re

from hypothesis import given
from hypothesis import strategies as st

from vqueues.api.auth import required_scope
from vqueues.api.openapi import openapi_document, query_parameters
from vqueues.errors import BadRequest
from vqueues.names import validate_name
from vqueues.settings import Settings
from vqueues.state.tags import check_tag
from vqueues.state.tokens import parse_token

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


def _schema(doc, name):
    return doc["components"]["schemas"][name]


# Text a schema-driven client might send: control characters, the spaces str.strip() strips
# (and U+FEFF, which it does not), commas, dots, hex digits, and some beyond ASCII.
_TEXT = st.text(alphabet=st.sampled_from(
    [*"ab0.9f,:- \t\n\x1c\x85\xa0\u2003\u3000\ufeff\x00\x7f\x9fé日", "\U0001F600"]),
    max_size=12)


def _accepts(pattern, text):
    return re.fullmatch(pattern.removeprefix("^").removesuffix("$"), text) is not None


def _valid_name(text):
    try:
        validate_name(text)
    except BadRequest:
        return False
    return True


@given(_TEXT)
def test_the_documents_patterns_are_the_rules_the_node_applies(text):
    doc = openapi_document(Settings())
    name = doc["paths"]["/v1/queues/{queue}"]["get"]["parameters"][0]["schema"]
    assert _accepts(name["pattern"], text) == _valid_name(text), repr(text)
    tag = _schema(doc, "LeaseRequest")["properties"]["tag"]
    assert _accepts(tag["pattern"], text) == (check_tag(text) is None), repr(text)
    token = _schema(doc, "TokensRequest")["properties"]["tokens"]["items"]
    assert _accepts(token["pattern"], text) == (parse_token(text) is not None), repr(text)


@given(st.integers(0, 2**70), st.integers(0, 2**40), st.integers(0, 2**70))
def test_every_token_the_node_makes_or_takes_matches_the_documents_pattern(o, a, g):
    token = _schema(openapi_document(Settings()), "TokensRequest")["properties"]["tokens"]
    text = f"{o}.{a}.{g:x}" if g else f"{o}.{a}"
    assert _accepts(token["items"]["pattern"], text) == (parse_token(text) is not None)


def test_every_route_but_the_probes_names_its_query_parameters_and_may_answer_400():
    doc = openapi_document(Settings())
    taken = query_parameters(doc)
    assert taken[("/v1/queues/{queue}/records", "GET")] == {
        "consumer", "offset", "limit", "wait_ms", "tag", "encoding"}
    assert taken[("/v1/queues/{queue}/records", "POST")] == frozenset()
    assert taken[("/metrics", "GET")] == {"name[]"}
    assert ("/healthz", "GET") not in taken and ("/readyz", "GET") not in taken
    for path, _, op in _operations(doc):
        assert ("400" in op["responses"]) == (path not in ("/healthz", "/readyz")), path
