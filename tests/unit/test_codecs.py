"""Codecs: offset-topic entries, the cluster map's records, and the HTTP record codec."""

import base64
from typing import Any

import pytest

from vqueues.api.answers import encode_record
from vqueues.api.enqueue_body import decode_records
from vqueues.errors import VQError
from vqueues.ownership.cluster_map import ClusterMap, Owner, encode_claim, encode_release
from vqueues.records import (
    ConsumerAcked,
    ConsumerConfigured,
    ConsumerDeleted,
    QueueDeleted,
    Record,
    decode_offset_entry,
    encode_offset_entry,
)
from vqueues.settings import Settings

ENTRIES = [ConsumerAcked("q", "c", 0, 1_700_000_000_000),
           ConsumerAcked("a::b/ü", '["c"]', 2**40, 1_700_000_000_001),
           ConsumerDeleted("q", "c"), QueueDeleted("q", 17),
           ConsumerConfigured("q", "sqs", "lease", 5, "q-dead", 30_000, None, None, True,
                              (("CreatedTimestamp", "1700000000"), ("DelaySeconds", "5"))),
           ConsumerConfigured("q", "c", "lease", 5, None, 30_000)]


def test_a_settings_entry_carries_attributes_only_when_it_has_some():
    import json
    with_attrs = ConsumerConfigured("q", "sqs", "lease", 5, None, 1000, None, None, False,
                                    (("FifoQueue", "true"),))
    body = json.loads(encode_offset_entry(with_attrs)[1] or b"")
    assert body["attributes"] == {"FifoQueue": "true"}
    plain = ConsumerConfigured("q", "c", "lease", 5, None, 1000)
    assert "attributes" not in json.loads(encode_offset_entry(plain)[1] or b"")


@pytest.mark.parametrize("entry", ENTRIES)
def test_every_offset_entry_survives_encoding(entry):
    assert decode_offset_entry(*encode_offset_entry(entry)) == entry


def test_a_consumer_deletion_is_a_tombstone_on_the_consumers_key():
    key, value = encode_offset_entry(ConsumerDeleted("q", "c"))
    assert value is None and key == encode_offset_entry(ConsumerAcked("q", "c", 1))[0]


@pytest.mark.parametrize(("key", "value"), [
    (None, b"{}"), (b"", b"{}"), (b"not json", b"{}"), (b'["x", "q"]', b"{}"),
    (b'["c", "q", "c"]', b"{}"), (b'["q", "q"]', None), (b'["c", "q"]', b'{"offset": 1}'),
])
def test_records_not_written_by_vqueues_decode_to_none(key, value):
    assert decode_offset_entry(key, value) is None


def test_the_cluster_map_follows_claims_and_releases_by_the_current_owner_only():
    m = ClusterMap(4)
    m.apply([encode_claim(1, "a", "http://a", 1), encode_claim(2, "a", "http://a", 1)])
    m.apply([encode_claim(1, "b", "http://b", 2)])
    m.apply([encode_release(1, "a", 1)])  # a no longer owns 1: ignored
    m.apply([encode_release(2, "a", 1)])
    m.apply([(b"9", b"{}"), (b"x", b"{}"), (b"3", b"not json")])  # out of range, garbage
    assert m.owners == {1: Owner("b", "http://b", 2)}
    assert m.generation == 2


SETTINGS = Settings(max_batch_records=3, max_record_bytes=4)


@pytest.mark.parametrize(("body", "code"), [
    ({}, "invalid_records"), ({"records": []}, "invalid_records"),
    ({"records": "x"}, "invalid_records"), ({"records": [{"value": "a"}] * 4}, "too_many_records"),
    ({"records": [{"headers": {}}]}, "invalid_record"), ({"records": [5]}, "invalid_record"),
    ({"records": [{"value": 5}]}, "invalid_record"),
    ({"records": [{"value": "a", "encoding": "hex"}]}, "invalid_record"),
    ({"records": [{"value": "***", "encoding": "base64"}]}, "invalid_record"),
    ({"records": [{"value": "a", "headers": {"k": 1}}]}, "invalid_record"),
    ({"records": [{"value": "a", "x": 1}]}, "invalid_record"),
    ({"records": [{"value": "12345"}]}, "record_too_large"),
])
def test_bad_enqueue_bodies_get_their_registry_code(body, code):
    with pytest.raises(VQError) as err:
        decode_records(body, SETTINGS)
    assert err.value.code == code


def test_enqueue_bodies_decode_values_and_headers():
    got = decode_records({"records": [
        {"value": "hé", "headers": {"k": "v"}}, {"value": None},
        {"value": base64.b64encode(b"\xff\x00").decode(), "encoding": "base64"}]}, SETTINGS)
    assert got == [("hé".encode(), [("k", b"v")]), (None, []), (b"\xff\x00", [])]


def test_a_record_that_is_not_utf8_is_returned_base64_and_says_so():
    rec = Record(5, 1, b"\xff", (("h", b"x"),))
    out = encode_record(rec, "utf8")
    assert (out.value, out.headers, out.encoding) == ("/w==", {"h": "eA=="}, "base64")
    assert encode_record(Record(5, 1, b"ok", (("h", None),)), "utf8").encoding is None
    assert encode_record(Record(5, 1, b"ok", ()), "base64").value == "b2s="


@pytest.mark.parametrize(("body", "code"), [
    (b"", "malformed_json"), (b"{not json", "malformed_json"), (b"[1]", "malformed_json"),
    (b"{}", "invalid_records"), (b'{"records": []}', "invalid_records"),
    (b'{"records": [{"value": "a"}, {"value": "b"}, {"value": "c"}, {"value": "d"}]}',
     "too_many_records"),
    (b'{"records": [{"value": "a", "x": 1}]}', "invalid_record"),
    (b'{"records": [{"value": "a", "encoding": "hex"}]}', "invalid_record"),
    (b'{"records": [{"value": "12345"}]}', "record_too_large"),
    (b'{"records": [{"value": "***", "encoding": "base64"}]}', "invalid_record"),
])
def test_the_fast_enqueue_decoder_gives_the_same_codes(body, code):
    from vqueues.api.enqueue_body import decode_enqueue

    with pytest.raises(VQError) as err:
        decode_enqueue(body, SETTINGS)
    assert err.value.code == code


def test_the_fast_enqueue_decoder_agrees_with_the_checked_one():
    import json

    from vqueues.api.enqueue_body import decode_enqueue

    body: dict[str, Any] = {"records": [{"value": "hé", "headers": {"k": "v"}}, {"value": None},
                        {"value": base64.b64encode(b"\xff").decode(), "encoding": "base64"}]}
    assert decode_enqueue(json.dumps(body).encode(), SETTINGS) == decode_records(body, SETTINGS)
    body["extra"] = 1  # one policy: both refuse a field the body does not have
    for decode in (lambda: decode_enqueue(json.dumps(body).encode(), SETTINGS),
                   lambda: decode_records(body, SETTINGS)):
        with pytest.raises(VQError) as err:
            decode()
        assert err.value.code == "invalid_parameter"


def test_a_window_delta_is_written_as_its_structs_msgpack_and_reads_back_the_same():
    import random

    import msgspec

    from vqueues.records import DeliveryGroup, WindowDelta, _decode_window, _encode_window
    for seed in range(500):
        r = random.Random(seed)

        def offsets(r=r):
            return sorted(r.sample(range(10**6), r.randint(0, 6)))
        e = WindowDelta(
            "q" * r.randint(1, 5), "c", r.randint(0, 9), r.randint(0, 99),
            [DeliveryGroup(r.random() < .5, r.randint(0, 10**13), r.randint(0, 9),
                           r.randint(0, 2**48), r.choice([None, "why"]), offsets())
             for _ in range(r.randint(0, 3))],
            offsets(), r.choice([None, 5]), r.choice([None, 3]), r.randint(1, 10**13),
            r.random() < .5, r.randint(0, 99), offsets())
        gaps = [b - a for a, b in zip([0, *e.done], e.done, strict=False)]
        assert msgspec.msgpack.decode(_encode_window(e))[5] == gaps
        assert _decode_window(_encode_window(e)) == e


def test_a_prefix_settles_tokens_are_read_as_pairs_and_each_fault_named():
    from vqueues.api.prefix import _pairs

    good = [{"queue": "t-1", "token": "5.1.a"}, {"token": "6.1.b", "queue": "t-1"},
            {"queue": "t-2", "token": "7.1.c"}]
    assert _pairs(good) == [("t-1", "5.1.a"), ("t-1", "6.1.b"), ("t-2", "7.1.c")]
    for bad, code in (([], "invalid_token"), ("5.1.a", "invalid_token"),
                      ([*good, "5.1.a"], "invalid_token"),
                      ([*good, {"queue": "t-1"}], "invalid_token"),
                      ([*good, {"queue": "t-1", "token": 5}], "invalid_token"),
                      ([*good, {"queue": "t-1", "token": "5.1.a", "x": 1}], "invalid_parameter"),
                      ([*good, {"queue": "t-1", "x": "5.1.a"}], "invalid_token"),
                      ([*good, {"queue": "", "token": "5.1.a"}], "invalid_name"),
                      ([{"queue": "a\nb", "token": "5.1.a"}], "invalid_name")):
        with pytest.raises(VQError) as err:
            _pairs(bad)
        assert err.value.code == code, bad
