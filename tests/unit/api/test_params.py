"""Query parameters: validation and the OpenAPI document read the same specs."""

import pytest

from vqueues.api import params
from vqueues.api.openapi import openapi_document
from vqueues.errors import VQError
from vqueues.settings import Settings

SETTINGS = Settings(max_read_limit=50, default_read_limit=20, max_wait_ms=900,
                    max_list_queues=300)


def _integer_params(doc):
    for path, item in doc["paths"].items():
        for method, op in item.items():
            for p in op.get("parameters", []):
                if p["in"] == "query" and p["schema"].get("type") == "integer":
                    yield path, method, p


SPECS = {("/v1/queues/{queue}/records", "get", "offset"): params.READ_OFFSET,
         ("/v1/queues/{queue}/records", "get", "limit"): params.READ_LIMIT,
         ("/v1/queues/{queue}/records", "get", "wait_ms"): params.READ_WAIT_MS,
         ("/v1/queues", "get", "limit"): params.LIST_LIMIT,
         ("/v1/queues/{queue}/consumers/{consumer}/stream", "get", "visibility_ms"):
             params.LEASE_VISIBILITY_MS}

BODY_SPECS = {("LeaseRequest", "max_records"): params.LEASE_MAX_RECORDS,
              ("LeaseRequest", "visibility_ms"): params.LEASE_VISIBILITY_MS,
              ("LeaseRequest", "wait_ms"): params.LEASE_WAIT_MS,
              ("RetryRequest", "delay_ms"): params.RETRY_DELAY_MS,
              ("ExtendRequest", "visibility_ms"): params.LEASE_VISIBILITY_MS}


def test_every_documented_body_bound_and_default_is_what_validation_enforces():
    schemas = openapi_document(SETTINGS)["components"]["schemas"]
    for (schema, name), spec in BODY_SPECS.items():
        prop = schemas[schema]["properties"][name]
        lo, hi = prop["minimum"], prop["maximum"]
        assert spec.from_body({name: lo}, SETTINGS) == lo
        assert spec.from_body({name: hi}, SETTINGS) == hi
        for bad in (lo - 1, hi + 1):
            with pytest.raises(VQError) as err:
                spec.from_body({name: bad}, SETTINGS)
            assert err.value.code == "limit_out_of_range"
        with pytest.raises(VQError) as err:
            spec.from_body({name: "5"}, SETTINGS)
        assert err.value.code == "invalid_parameter"
        assert spec.from_body({}, SETTINGS) == prop.get("default")


def test_every_documented_bound_and_default_is_what_validation_enforces():
    found = list(_integer_params(openapi_document(SETTINGS)))
    assert {(path, m, p["name"]) for path, m, p in found} == set(SPECS)
    for path, method, p in found:
        spec = SPECS[(path, method, p["name"])]
        lo, hi = p["schema"]["minimum"], p["schema"]["maximum"]
        assert spec.parse({p["name"]: str(lo)}, SETTINGS) == lo
        assert spec.parse({p["name"]: str(hi)}, SETTINGS) == hi
        for bad in (lo - 1, hi + 1):
            with pytest.raises(VQError) as err:
                spec.parse({p["name"]: str(bad)}, SETTINGS)
            assert err.value.code == "limit_out_of_range"
        assert spec.parse({}, SETTINGS) == p["schema"].get("default")


def test_a_parameter_that_is_not_an_integer_is_invalid():
    with pytest.raises(VQError) as err:
        params.READ_LIMIT.parse({"limit": "ten"}, SETTINGS)
    assert err.value.code == "invalid_parameter"


def test_the_list_default_never_exceeds_its_maximum():
    assert params.LIST_LIMIT.parse({}, Settings(max_list_queues=10)) == 10
