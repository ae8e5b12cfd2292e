"""Byte-level mutations of valid requests: what a broken or hostile client sends.

`requests(rng, token)` yields raw HTTP/1.1 requests, each a valid request of some route with
one or more mutations (bytes flipped, strings made non-UTF-8, bodies truncated, nested deep,
keys doubled, numbers made huge, types swapped, fields added, content types and encodings
wrong or broken, paths, queries and headers made non-UTF-8). `send` sends one over a fresh
connection; `violation` says what is wrong with an answer, if anything: a node must answer
each with a status below 500 and, for a refusal, the error registry's JSON.

Used by tests/test_fuzz.py (a seeded run in the suite) and scripts/fuzz.py (a long run).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from urllib.parse import quote

from vqueues.errors import REGISTRY


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # already percent-encoded, ASCII
    body: bytes = b""
    headers: dict[str, bytes] = field(default_factory=dict)
    mutations: tuple[str, ...] = ()

    def encode(self) -> bytes:
        head = [f"{self.method} {self.path} HTTP/1.1".encode(), b"Host: vq",
                b"Connection: close", b"Content-Length: %d" % len(self.body)]
        head += [k.encode() + b": " + v for k, v in self.headers.items()]
        return b"\r\n".join(head) + b"\r\n\r\n" + self.body


JSON = {"Content-Type": b"application/json"}


def valid(rng: random.Random) -> Request:
    """A valid request of a random route, on queue names starting with `q`."""
    q = quote(f"q{rng.randrange(50)}", safe="")
    c = f"/v1/queues/{q}/consumers/c{rng.randrange(3)}"
    pc = f"/v1/prefix-consumers/p{rng.randrange(3)}"
    bodies: list[tuple[str, str, object]] = [
        ("POST", f"/v1/queues/{q}/records", {"records": [
            {"value": "hello: world", "headers": {"k": "v"}, "tags": ["t1"]},
            {"value": "aGk=", "encoding": "base64", "idempotency_key": f"k{rng.random()}"},
            {"value": None, "delay_ms": 10}]}),
        ("POST", f"{c}/ack", {"offset": 1, "allow_rewind": False}),
        ("PUT", c, {"mode": "lease", "max_attempts": 3, "visibility_ms": 1000,
                    "dead_letter_queue": "dlq", "max_in_flight": 5}),
        ("POST", f"{c}/lease", {"max_records": 5, "wait_ms": 0, "visibility_ms": 1000,
                                "encoding": "utf8"}),
        ("POST", f"{c}/complete", {"tokens": ["0.1.2dd6f489fa7d"]}),
        ("POST", f"{c}/retry", {"tokens": ["0.1.2dd6f489fa7d"], "delay_ms": 5,
                                "reason": "because"}),
        ("POST", f"{c}/extend", {"tokens": ["0.1.2dd6f489fa7d"], "visibility_ms": 500}),
        ("PUT", pc, {"prefix": "qp-", "max_attempts": 2, "records_per_turn": 3,
                     "weights": {"qp-1": 2}}),
        ("POST", f"{pc}/lease", {"max_records": 3}),
        ("POST", f"{pc}/complete", {"tokens": [{"queue": "qp-1", "token": "0.1.ab"}]}),
        ("POST", "/get_records", {"Queue": "q1", "MaxRecords": 2}),
        ("POST", "/consumer_ack", {"Queue": "q1", "Consumer": "c", "Offset": 0}),
    ]
    gets = [f"/v1/queues/{q}/records?limit=5&offset=0&encoding=utf8", f"/v1/queues/{q}",
            "/v1/queues?prefix=q&limit=10&stats=true", c, "/v1/partitions", pc]
    if rng.random() < 0.75:
        method, path, payload = rng.choice(bodies)
        return Request(method, path, json.dumps(payload).encode(), dict(JSON))
    return Request("GET", rng.choice(gets))


# Mutations -------------------------------------------------------------------------------------

_JUNK = [b"\xff", b"\xfe", b"\xc3", b"\xc3(", b"\xed\xa0\x80", b"\x00", b'"', b"\\", b"{", b"[",
         b"]", b"}", b",", b":", b"\\u", b"\\ud800", b"\xf4\x90\x80\x80"]


def _flip(rng: random.Random, r: Request) -> Request:
    body = bytearray(r.body or b"{}")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(body))
        body[i:i + 1] = rng.choice(_JUNK)
    return replace(r, body=bytes(body))


def _not_utf8_string(rng: random.Random, r: Request) -> Request:
    quotes = [m.end() for m in re.finditer(rb'"', r.body)] or [0]
    i = rng.choice(quotes)
    return replace(r, body=r.body[:i] + rng.choice([b"\xff\xfe", b"\xc3", b"\xed\xa0\x80"])
                   + r.body[i:])


def _truncate(rng: random.Random, r: Request) -> Request:
    return replace(r, body=r.body[:rng.randrange(len(r.body) + 1)])


def _nest(rng: random.Random, r: Request) -> Request:
    depth = rng.choice([33, 100, 1000, 30_000])
    deep = b"[" * depth + b"]" * depth
    if rng.random() < 0.3 or b":" not in r.body:
        return replace(r, body=deep)
    i = r.body.index(b":") + 1
    j = r.body.find(b",", i)
    j = len(r.body) - 1 if j < 0 else j
    return replace(r, body=r.body[:i] + deep + r.body[j:])


def _double_key(rng: random.Random, r: Request) -> Request:
    pairs = list(re.finditer(rb'"[a-zA-Z_]+": ("[^"]*"|-?\d+|true|false|null)', r.body))
    if not pairs:
        return _unknown_field(rng, r)
    m = rng.choice(pairs)
    return replace(r, body=r.body[:m.end()] + b", " + m.group(0) + r.body[m.end():])


def _huge_number(rng: random.Random, r: Request) -> Request:
    numbers = list(re.finditer(rb"(?<=: )-?\d+", r.body))
    new = rng.choice([b"1" + b"0" * 400, b"-" + b"9" * 30, b"1e999", b"NaN", b"-0", b"0.5",
                      b"18446744073709551616", b"9223372036854775808"])
    if not numbers:
        return replace(r, body=r.body.replace(b"{", b'{"offset": ' + new + b", ", 1))
    m = rng.choice(numbers)
    return replace(r, body=r.body[:m.start()] + new + r.body[m.end():])


def _swap_type(rng: random.Random, r: Request) -> Request:
    values = list(re.finditer(rb'(?<=": )("[^"]*"|-?\d+|true|false|null|\[[^\[\]]*\])', r.body))
    if not values:
        return _flip(rng, r)
    m = rng.choice(values)
    new = rng.choice([b'"0.1"', b"[]", b"{}", b"null", b"true", b"1", b'[1, "x"]', b'""',
                      b'{"a": 1}'])
    return replace(r, body=r.body[:m.start()] + new + r.body[m.end():])


def _unknown_field(rng: random.Random, r: Request) -> Request:
    extra = rng.choice([b'"zz": 1, ', b'"Offset": 2, ', b'"records": [], ', b'"": null, '])
    return replace(r, body=r.body.replace(b"{", b"{" + extra, 1) if r.body else b"{}")


def _content_type(rng: random.Random, r: Request) -> Request:
    ctype = rng.choice([b"text/plain", b"application/x-www-form-urlencoded",
                        b"application/octet-stream", b"application/json; charset=latin-1",
                        b"multipart/form-data; boundary=x", b"", b"application/json;;",
                        b"application/vnd.x+json", b"APPLICATION/JSON", b"*/*"])
    return replace(r, headers={**r.headers, "Content-Type": ctype})


def _content_encoding(rng: random.Random, r: Request) -> Request:
    how = rng.choice(["gzip", "gzip-junk", "deflate", "deflate-junk", "br", "gzip, gzip",
                      "identity", "x-unknown", "gzip-truncated"])
    body = r.body
    if how == "gzip":
        body = gzip.compress(body)
    elif how == "deflate":
        body = zlib.compress(body)
    elif how == "gzip-truncated":
        body = gzip.compress(body)[:-8]
    elif how.endswith("-junk"):
        body = bytes(rng.randrange(256) for _ in range(20))
    name = how.removesuffix("-junk").removesuffix("-truncated")
    return replace(r, body=body, headers={**r.headers, "Content-Encoding": name.encode()})


def _path(rng: random.Random, r: Request) -> Request:
    junk = rng.choice(["%FF%FE", "%C3%28", "%00", "%0A", "%2F..%2F", "%E2%82", "x" * 300,
                       "%ED%A0%80", "%F4%90%80%80", "%25FF"])
    if "?" in r.path and rng.random() < 0.5:
        path, _, query = r.path.partition("?")
        key = rng.choice(["limit", "offset", "wait_ms", "encoding", "tag", "consumer",
                          "prefix", "after", "stats"])
        return replace(r, path=f"{path}?{query}&{key}={junk}")
    parts = r.path.split("/")
    i = rng.randrange(1, len(parts))
    parts[i] = parts[i] + junk
    return replace(r, path="/".join(parts))


def _header(rng: random.Random, r: Request) -> Request:
    name = rng.choice(["X-Junk", "Authorization", "Origin", "Content-Type", "Accept"])
    value = rng.choice([b"\xff\xfe", b"Bearer \xff", b"Bearer ", b"Bearer a.b.c", b"\xc3(",
                        b"Basic Zm9vOmJhcg==", b"x" * 8000])
    return replace(r, headers={**r.headers, name: value})


def _method(rng: random.Random, r: Request) -> Request:
    return replace(r, method=rng.choice(["GET", "PUT", "DELETE", "PATCH", "POST", "OPTIONS"]))


MUTATIONS = {f.__name__.lstrip("_"): f for f in (
    _flip, _not_utf8_string, _truncate, _nest, _double_key, _huge_number, _swap_type,
    _unknown_field, _content_type, _content_encoding, _path, _header, _method)}


def requests(rng: random.Random, token: str | None) -> Iterator[Request]:
    """Mutated requests without end, each with 1–3 mutations, most carrying `token`."""
    names = sorted(MUTATIONS)
    while True:
        r = valid(rng)
        if token is not None and rng.random() < 0.9:
            r = replace(r, headers={**r.headers, "Authorization": f"Bearer {token}".encode()})
        done = []
        for name in rng.sample(names, rng.randint(1, 3)):
            r = MUTATIONS[name](rng, r)
            done.append(name)
        yield replace(r, mutations=tuple(done))


# Sending and checking --------------------------------------------------------------------------

@dataclass
class Answer:
    status: int
    content_type: str
    body: bytes


async def send(host: str, port: int, request: Request, timeout_s: float = 15.0) -> Answer:
    """One request on a fresh connection; the answer read until the node closes it."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(request.encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), timeout_s)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    status = int(lines[0].split(b" ", 2)[1]) if lines and lines[0] else 0
    ctype = next((v.strip().decode("latin-1") for k, _, v in (x.partition(b":") for x in lines[1:])
                  if k.strip().lower() == b"content-type"), "")
    if b"chunked" in head.lower():
        body = _unchunk(body)
    return Answer(status, ctype, body)


def _unchunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2:]
    return out


def violation(answer: Answer) -> str | None:
    """What is wrong with an answer to a mutated request, or None."""
    if answer.status == 0:
        return "no answer"
    if answer.status >= 500:
        return f"{answer.status}: {answer.body[:300]!r}"
    if answer.status < 400:
        return None
    if not answer.content_type.startswith("application/json"):
        return f"{answer.status} answered as {answer.content_type!r}: {answer.body[:200]!r}"
    try:
        err = json.loads(answer.body)["error"]
        spec = REGISTRY[err["code"]]
    except (ValueError, KeyError, TypeError):
        return f"{answer.status} without the registry's error form: {answer.body[:200]!r}"
    if (spec.status, spec.retriable) != (answer.status, err.get("retriable")) or \
            not isinstance(err.get("message"), str):
        return f"{answer.status} {err['code']} does not match the registry: {err}"
    return None
