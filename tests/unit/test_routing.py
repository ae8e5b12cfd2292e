"""Routing: both murmur2 copies (server and client) against the vectors kept in tests/data."""

import json
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import vqueues_client.hashing as client_hashing
from hypothesis import given, settings
from hypothesis import strategies as st

import vqueues.hashing as server_hashing

DATA = Path(__file__).resolve().parents[1] / "data" / "murmur2_vectors.json"
SHARED = Path(__file__).resolve().parents[3] / "shared" / "testdata" / "murmur2_vectors.json"
VECTORS = json.loads(DATA.read_text())
CASES = [(c["queue"], int(n), p) for c in VECTORS["cases"] for n, p in c["partitions"].items()]
COPIES = [pytest.param(server_hashing, id="server"), pytest.param(client_hashing, id="client")]


@pytest.mark.parametrize("impl", COPIES)
@pytest.mark.parametrize(("queue", "partitions", "expected"), CASES)
def test_partition_matches_librdkafkas_java_compatible_partitioner(impl, queue, partitions,
                                                                   expected):
    assert impl.partition_for(queue, partitions) == expected


@pytest.mark.parametrize("impl", COPIES)
@pytest.mark.parametrize(("key", "expected"), sorted(VECTORS["java_reference_hashes"].items()))
def test_murmur2_matches_apache_kafkas_unit_test_hashes(impl, key, expected):
    assert impl.murmur2_signed(key.encode()) == expected


def test_partitions_for_routes_the_vectors_as_partition_for():
    for partitions in {n for _, n, _ in CASES}:
        cases = [(q, p) for q, n, p in CASES if n == partitions]
        got = server_hashing.partitions_for([q for q, _ in cases], partitions)
        assert got.tolist() == [p for _, p in cases]


@given(st.lists(st.text(max_size=70), max_size=200), st.integers(1, 5000),
       st.sampled_from([1, 7, 16_384]))
@settings(deadline=None, derandomize=True, database=None)
def test_partitions_for_routes_every_name_as_partition_for_does(names, partitions, step):
    """Every tail length (UTF-8 of 0 to 3 bytes past the last block), names in several steps."""
    with mock.patch.object(server_hashing, "STEP", step):
        got = server_hashing.partitions_for(names, partitions)
    assert got.dtype == np.int64
    assert got.tolist() == [server_hashing.partition_for(n, partitions) for n in names]


def test_every_vector_case_was_loaded():
    assert len(CASES) >= 59 * 7


@pytest.mark.skipif(not SHARED.exists(), reason="no ../shared/testdata beside this clone")
def test_the_kept_vectors_equal_the_shared_copy_when_it_is_there():
    assert json.loads(SHARED.read_text()) == VECTORS
