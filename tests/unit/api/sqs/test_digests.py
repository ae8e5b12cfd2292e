"""MD5OfMessageBody and MD5OfMessageAttributes, against digests other SQS implementations'
tests hold (the first is the example of AWS's documentation)."""

import hashlib

import pytest

from vqueues.api.sqs.digests import MessageAttribute, md5_of_attributes, md5_of_body

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("attributes", "digest"), [
    ({"SellerName": MessageAttribute("String", "Example Store")},
     "cd28f3b68aeee4b2eac9c66f2f694b58"),
    ({"timestamp": MessageAttribute("Number", "1493147359900")},
     "235c5c510d26fb653d073faed50ae77c"),
    ({"ordinal": MessageAttribute("Number", "1"), "category": MessageAttribute("String", "test")},
     "d21ae90c49061e927f57df5f5d72be1f"),
])
def test_attribute_digests_match_known_ones(attributes, digest):
    assert md5_of_attributes(attributes) == digest


def test_a_binary_attribute_travels_as_transport_type_2_with_its_raw_bytes():
    raw = b"\x00\xff"
    expected = hashlib.md5(len(b"b").to_bytes(4, "big") + b"b" + (6).to_bytes(4, "big")
                           + b"Binary" + b"\x02" + (2).to_bytes(4, "big") + raw).hexdigest()
    assert md5_of_attributes({"b": MessageAttribute("Binary", binary=raw)}) == expected
    assert md5_of_attributes({"b": MessageAttribute("Binary.png", binary=raw)}) != expected


def test_the_body_digest_is_the_md5_of_its_utf8():
    assert md5_of_body("ü") == hashlib.md5("ü".encode()).hexdigest()
