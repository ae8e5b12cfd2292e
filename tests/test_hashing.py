import json
from pathlib import Path

import pytest

from vqueues.hashing import murmur2_signed, partition_for

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "shared/testdata/murmur2_vectors.json").read_text())
CASES = [(c["queue"], int(n), p) for c in VECTORS["cases"] for n, p in c["partitions"].items()]


@pytest.mark.parametrize(("queue", "partitions", "expected"), CASES)
def test_partition_matches_librdkafkas_java_compatible_partitioner(queue, partitions, expected):
    assert partition_for(queue, partitions) == expected


@pytest.mark.parametrize(("key", "expected"), sorted(VECTORS["java_reference_hashes"].items()))
def test_murmur2_matches_apache_kafkas_unit_test_hashes(key, expected):
    assert murmur2_signed(key.encode()) == expected


def test_every_vector_case_was_loaded():
    assert len(CASES) >= 59 * 7
