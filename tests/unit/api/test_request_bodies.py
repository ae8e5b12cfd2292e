"""Request bodies (vqueues/api/body.py): strict JSON before any handler looks at a field."""

import json
import random
from typing import Any

import pytest

from vqueues.api.body import MAX_JSON_DEPTH, decode_object, refuse_unknown, shape
from vqueues.api.enqueue_body import decode_enqueue
from vqueues.errors import VQError
from vqueues.settings import Settings

SETTINGS = Settings()
TEXTS = ["x", "a:b", "::", 'say "hi": ok', "é:ü", "\\:", "{\"k\": 1}", "", "日本:語", "tab\t:"]


def _text(rng: random.Random) -> str:
    return rng.choice(TEXTS) + str(rng.randrange(1000))


def _dump(value, rng: random.Random) -> str:
    """JSON text of `value`, where a list of pairs is an object (so that a key can repeat),
    with or without \\u escapes (of colons too), as different clients write it."""
    if isinstance(value, list) and value and isinstance(value[0], tuple):
        return "{" + ", ".join(f"{_dump(k, rng)}: {_dump(v, rng)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v, rng) for v in value) + "]"
    text = json.dumps(value, ensure_ascii=rng.random() < 0.5)
    if isinstance(value, str) and rng.random() < 0.2:
        text = text.replace(":", rng.choice(["\\u003a", "\\u003A"]))  # the same string
    return text


def _record(rng: random.Random) -> list[tuple[str, object]]:
    pairs: list[tuple[str, object]] = []
    encoding = rng.choice([None, "utf8", "base64"])
    pairs.append(("value", "YTpi" if encoding == "base64" else
                  rng.choice([_text(rng), None])))
    if encoding:
        pairs.append(("encoding", encoding))
    if rng.random() < 0.4:
        pairs.append(("headers", [(_text(rng), _text(rng)) for _ in range(rng.randrange(3))]
                      or {}))
    if rng.random() < 0.3:
        pairs.append(("idempotency_key", rng.choice([_text(rng), None])))
    if rng.random() < 0.3:
        pairs.append(("tags", rng.choice([None, [f"t{rng.randrange(9)}"]])))
    if rng.random() < 0.3:
        pairs.append(rng.choice([("delay_ms", rng.randrange(0, 1000)), ("deliver_at", 1),
                                 ("delay_ms", None)]))
    rng.shuffle(pairs)
    return pairs


def _repeat_a_key(body: list[Any], rng: random.Random) -> None:
    """Name one key of one object twice (the body's, a record's or a record's headers')."""
    objects = [body] + body[0][1]
    objects += [v for r in body[0][1] for k, v in r if k == "headers" and v]
    target = rng.choice(objects)
    key, value = rng.choice(target)
    target.insert(rng.randrange(len(target) + 1), (key, value))


def test_a_key_named_twice_in_any_object_is_refused_and_only_then():
    """Model-based: the counting shortcut on the fast path agrees with a full parse that
    watches every object, over random bodies with colons, quotes and escapes in strings."""
    rng = random.Random(20261125)
    refused = accepted = 0
    for _ in range(3000):
        body = [("records", [_record(rng) for _ in range(rng.randrange(1, 6))])]
        twice = rng.random() < 0.5
        if twice:
            _repeat_a_key(body, rng)
        raw = _dump(body, rng).encode()
        try:
            decode_enqueue(raw, SETTINGS)
        except VQError as exc:
            assert twice and exc.code == "malformed_json" and "twice" in exc.message, raw
            refused += 1
        else:
            assert not twice, raw
            accepted += 1
    assert refused > 1000 and accepted > 1000


@pytest.mark.parametrize("raw", [
    b'{"records": [{"value": "\xff"}]}',
    b'{"offset": "\xc3("}',
    b"[" * 30_000 + b"]" * 30_000,
    b'{"a": ' + b"[" * (MAX_JSON_DEPTH + 1) + b"]" * (MAX_JSON_DEPTH + 1) + b"}",
    b'{"a": 1, "a": 2}',
    b'{"a": 1, "\\u0061": 2}',
    b'{"a": NaN}',
    b'{"a": 1e400}',
    b'{"a": 18446744073709551616}',  # beyond 64 bits, as written or with an exponent
    b'{"a": [-9223372036854775809]}',
    b'{"a": {"b": 1e30}}',
    b'{"a": 1',
    b"[]",
    b"",
])
def test_bodies_that_are_not_one_strict_json_object_are_malformed(raw):
    with pytest.raises(VQError) as exc:
        decode_object(raw)
    assert (exc.value.code, exc.value.status) == ("malformed_json", 400)


def test_depth_is_counted_outside_strings_only():
    deep: list[Any] = [[]]
    for _ in range(MAX_JSON_DEPTH - 3):
        deep = [deep]
    assert shape({"a": deep}) is not None and shape({"a": [deep]}) is None  # 32 and 33 levels
    brackets_in_strings = json.dumps({"v": "[[[{{{" * 100, "w": ["]]]"] * 50}).encode()
    assert decode_object(brackets_in_strings)["w"] == ["]]]"] * 50
    inner = b"[" * (MAX_JSON_DEPTH - 1) + b"]" * (MAX_JSON_DEPTH - 1)  # the object is one
    assert decode_object(b'{"a": ' + inner + b"}") == {"a": json.loads(inner)}


def test_unknown_fields_are_named():
    refuse_unknown({"offset": 1}, ("offset", "allow_rewind"))
    with pytest.raises(VQError) as exc:
        refuse_unknown({"offset": 1, "ofset": 2, "z": 0}, ("offset",))
    assert exc.value.code == "invalid_parameter" and exc.value.details["unknown"] == [
        "ofset", "z"]


def test_keys_twice_are_found_in_any_object_and_colons_in_strings_fool_nothing():
    """The colon count (`shape`) settles most bodies without a second parse; a body it cannot
    settle is parsed again, so no doubled key gets through either way."""
    fine = [{"queue": f"q:{i}", "token": "1.2:3"} for i in range(100)]
    assert decode_object(json.dumps({"tokens": fine}).encode())["tokens"] == fine
    for raw in (b'{"tokens": [{"queue": "a", "queue": "b"}]}',
                b'{"t": [{"a": ":"}, {"b": 1, "b": 1}]}',
                b'{"t": [{"a\\u003a": 1, "a:": 2}], "t": 1}',
                b'{"x": {"y": {"z": 1, "z": 1}}}'):
        with pytest.raises(VQError) as exc:
            decode_object(raw)
        assert exc.value.code == "malformed_json", raw


def test_a_number_without_a_fraction_is_an_integer_however_written():
    # JSON Schema's `integer` (the OpenAPI document's) takes 5.0 and 1e3; so does the node.
    body = decode_object(b'{"a": 5.0, "b": [1e3, -0.0, 2.5], "c": 9007199254740993.0, '
                        b'"d": 18446744073709551615, "e": "1.0"}')
    assert body == {"a": 5, "b": [1000, 0, 2.5], "c": 9007199254740993,
                    "d": 18446744073709551615, "e": "1.0"}
    assert type(body["a"]) is int and type(body["b"][2]) is float


def test_an_enqueue_takes_integral_numbers_and_refuses_a_false_headers():
    records = decode_enqueue(b'{"records": [{"value": "x", "delay_ms": 0.0}]}', SETTINGS)
    assert len(records) == 1
    # A due time beyond 64 bits is refused like any such integer, on the fast path too.
    with pytest.raises(VQError) as exc:
        decode_enqueue(b'{"records": [{"value": "x", "deliver_at": -9223372036854775809}]}',
                       SETTINGS)
    assert exc.value.code == "malformed_json"
    for headers in (b"false", b"0", b'""', b"[]"):
        with pytest.raises(VQError) as exc:
            decode_enqueue(b'{"records": [{"value": "x", "headers": ' + headers + b"}]}",
                           SETTINGS)
        assert exc.value.code == "invalid_record", headers


def test_an_enqueue_body_without_records_but_with_an_unknown_field_names_the_field():
    with pytest.raises(VQError) as err:
        decode_enqueue(b'{"nothing": 1}', SETTINGS)
    assert (err.value.code, err.value.details["unknown"]) == ("invalid_parameter", ["nothing"])
    with pytest.raises(VQError) as err:
        decode_enqueue(b'{}', SETTINGS)
    assert err.value.code == "invalid_records"
