"""Per-tenant quotas as pure state: longest prefix, burst, refill, debt, reload."""

import json

import pytest

from tests.narrow import known
from vqueues.queues.quotas import Quota, QuotaFile, Quotas, parse

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_longest_prefix_is_the_tenant_and_unmatched_queues_are_free():
    quotas = Quotas([Quota("t/", 1, 0), Quota("t/acme/", 100, 0)], Clock())
    assert known(quotas.match("t/acme/jobs")).prefix == "t/acme/"
    assert known(quotas.match("t/other")).prefix == "t/"
    assert quotas.match("free") is None
    assert quotas.charge("free", 10**6, 10**9) is None


def test_a_burst_passes_then_the_rate_holds_with_retry_after():
    clock = Clock()
    quotas = Quotas([Quota("a/", records_per_s=10, bytes_per_s=0, burst_s=2)], clock)
    for _ in range(20):  # 2 s worth
        assert quotas.charge("a/q", 1, 5) is None
    refused = quotas.charge("a/q", 1, 5)
    assert refused is not None and refused.limit == "records_per_s"
    assert refused.retry_after_s == 1 and refused.prefix == "a/"
    clock.now += 0.5  # 5 records' worth refilled
    assert all(quotas.charge("a/q", 1, 0) is None for _ in range(5))
    assert quotas.charge("a/q", 1, 0) is not None


def test_a_refused_request_takes_nothing():
    clock = Clock()
    quotas = Quotas([Quota("a/", records_per_s=10, bytes_per_s=100, burst_s=1)], clock)
    assert quotas.charge("a/q", 1, 100) is None  # bytes used up, records not
    refused = quotas.charge("a/q", 1, 50)
    assert refused is not None and refused.limit == "bytes_per_s"
    clock.now += 0.5
    assert quotas.charge("a/q", 9, 50) is None  # the refused record was not counted


def test_a_batch_over_the_burst_passes_on_a_full_bucket_and_leaves_debt():
    clock = Clock()
    quotas = Quotas([Quota("a/", records_per_s=10, bytes_per_s=0, burst_s=1)], clock)
    assert quotas.charge("a/q", 50, 0) is None  # never refused for good
    refused = quotas.charge("a/q", 1, 0)
    assert refused is not None and refused.retry_after_s == 5  # 40 in debt + 1, at 10/s
    clock.now += 4.0
    assert quotas.charge("a/q", 1, 0) is not None
    clock.now += 0.15
    assert quotas.charge("a/q", 1, 0) is None  # the long-run rate is the quota


def test_replacing_the_limits_keeps_the_level_of_unchanged_prefixes():
    clock = Clock()
    quotas = Quotas([Quota("a/", 10, 0)], clock)
    for _ in range(10):
        quotas.charge("a/q", 1, 0)
    quotas.replace([Quota("a/", 10, 0), Quota("b/", 1, 0)])
    assert quotas.charge("a/q", 1, 0) is not None  # still empty: a reload is no reset
    assert quotas.charge("b/q", 1, 0) is None


@pytest.mark.parametrize("raw, why", [
    ([], "quotas"),
    ({"quotas": [{"records_per_s": 1}]}, "prefix"),
    ({"quotas": [{"prefix": "a", "records_per_s": -1}]}, ">= 0"),
    ({"quotas": [{"prefix": "a", "records_per_s": True}]}, ">= 0"),
    ({"quotas": [{"prefix": "a", "burst_s": 0}]}, "above 0"),
    ({"quotas": [{"prefix": "a", "rate": 1}]}, "unknown"),
    ({"quotas": [{"prefix": "a"}, {"prefix": "a"}]}, "twice"),
])
def test_a_bad_quota_file_is_named(raw, why):
    with pytest.raises(ValueError, match=why):
        parse(raw)


def test_the_file_is_reloaded_and_a_bad_edit_keeps_the_old_limits(tmp_path):
    path = tmp_path / "quotas.json"
    path.write_text(json.dumps({"quotas": [{"prefix": "a/", "records_per_s": 1}]}))
    qf = QuotaFile(str(path), Quotas([], Clock()))
    assert qf.quotas.match("a/x") is not None
    path.write_text("{not json")
    qf.reload()
    assert qf.quotas.match("a/x") is not None
    path.write_text(json.dumps({"quotas": [{"prefix": "b/", "records_per_s": 1}]}))
    qf.reload()
    assert qf.quotas.match("a/x") is None and qf.quotas.match("b/x") is not None
    path.write_text("[]")
    with pytest.raises(ValueError, match="quota file"):
        QuotaFile(str(path), Quotas([]))
