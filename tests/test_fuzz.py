"""Property-based fuzzing (schemathesis) of every operation in the node's own OpenAPI document,
against a real node with auth on: valid data, then schemathesis' negative data (values the
schema forbids), then byte-level mutations of valid requests (tests/mutations.py: non-UTF-8,
deep nesting, doubled keys, huge numbers, broken encodings and content types, mangled paths,
queries and headers) that no schema-driven generator reaches.

For each generated request, sent with a full token, a narrow token or none:
- no 5xx;
- every error is the registry's JSON form, with the registry's status and retriable flag;
- a refused request (4xx) changes nothing: the write counters and the queue's and consumer's
  state are the same before and after it.
After all of them the node is still healthy and ready and logged no crash.

The node runs with `max_wait_ms` of 50 (long polls end quickly), `max_schedule_delay_ms` of 0
and a `scheduler_tick_ms` longer than the run (no record moves or is dead-lettered later by
itself, which would look like a change).
"""

import asyncio
import itertools
import json
import random
import re
from collections import Counter
from pathlib import Path
from typing import TypedDict
from urllib.parse import quote

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from tests import mutations
from tests.support import LOGS, NodeProcess, http
from vqueues.api.auth import token_hash
from vqueues.errors import REGISTRY

FULL = "fuzz-full-token"
NARROW = "fuzz-narrow-token"  # read and write on queues starting with "q" only
EXAMPLES = 150
NEGATIVE_EXAMPLES = 60
MUTATED = 1500
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
_WRITE_COUNTERS = ("vq_records_enqueued_total", "vq_acks_total", "vq_queues_deleted_total",
                   "vq_records_leased_total", "vq_records_completed_total",
                   "vq_records_retried_total", "vq_records_dead_lettered_total")
_tokens = itertools.cycle([FULL, FULL, FULL, NARROW, None])
class _Sent(TypedDict):
    requests: int
    refused: int
    operations: set[str]


sent: _Sent = {"requests": 0, "refused": 0, "operations": set()}


@pytest.fixture(scope="module")
def fuzz_node(topics, tmp_path_factory):
    path = tmp_path_factory.mktemp("fuzz") / "tokens.json"
    path.write_text(json.dumps({"tokens": [
        {"name": "full", "sha256": token_hash(FULL),
         "scopes": {"read": [""], "write": [""], "admin": [""]}},
        {"name": "narrow", "sha256": token_hash(NARROW),
         "scopes": {"read": ["q"], "write": ["q"]}}]}))
    node = NodeProcess(topics, node_id="fuzz", extra_env={
        "VQ_AUTH": "true", "VQ_AUTH_TOKEN_FILE": str(path), "VQ_MAX_WAIT_MS": "50",
        "VQ_MAX_SCHEDULE_DELAY_MS": "0",
        # No expiry tick during the run: a fuzzed lease past its consumer's max_attempts would
        # be dead-lettered by itself between another request's before and after.
        "VQ_SCHEDULER_TICK_MS": "600000"}).start()
    try:
        yield node
    finally:
        node.terminate()


@pytest.fixture(scope="module")
def fuzz_schema(fuzz_node):
    return schemathesis.openapi.from_url(f"{fuzz_node.url}/v1/openapi.json")


_COUNTERS_QUERY = "&".join(f"name[]={name}" for name in _WRITE_COUNTERS)


def _counters(url):
    _, text = http("GET", f"{url}/metrics?{_COUNTERS_QUERY}")  # just these: fast to answer
    out = {}
    for line in text.decode().splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in _WRITE_COUNTERS:
            out[line.rsplit(" ", 1)[0]] = float(line.rsplit(" ", 1)[1])
    return out


def _state(url, case):
    """What a request could change: the write counters (they move with the request, unlike
    the partitions' ends, which the tail reaches a little later), its queue and consumer."""
    auth = {"Authorization": f"Bearer {FULL}"}
    queue = case.path_parameters.get("queue") if case.path_parameters else None
    about: object = None
    if isinstance(queue, str):
        status, info = http("GET", f"{url}/v1/queues/{quote(queue, safe='')}", headers=auth)
        if status == 200:
            about = (info["records"], info["first_offset"], info["last_offset"],
                     info["scheduled"], sorted((c["consumer"], c["mode"], c["offset"])
                                               for c in info["consumers"]))
        consumer = case.path_parameters.get("consumer")
        if isinstance(consumer, str) and about is not None:
            _, settings_ = http("GET", f"{url}/v1/queues/{quote(queue, safe='')}/consumers/"
                                f"{quote(consumer, safe='')}", headers=auth)
            about = (about, settings_)
    return _counters(url), about


def _refused_by_the_http_parser(response):
    """A request whose framing is broken is refused by the HTTP parser before the node sees
    it: 400 in plain text (docs/api.md). schemathesis' negative data may name any header,
    `Content-Length` with an empty value among them."""
    sent = {k.lower(): v for k, v in response.request.headers.items()}
    length = sent.get("content-length")
    broken = (length is not None and not re.fullmatch(r"[0-9]+", str(length))) \
        or "transfer-encoding" in sent
    plain = response.headers.get("content-type", [""])[0].startswith("text/plain")
    return response.status_code == 400 and plain and broken


def _check_error(response):
    status = response.status_code
    assert status < 500, f"{status}: {response.text[:500]}"
    if status < 400 or _refused_by_the_http_parser(response):
        return
    body = response.json()  # every error is JSON
    err = body["error"]
    assert set(err) >= {"code", "message", "retriable"}, body
    spec = REGISTRY[err["code"]]
    assert (spec.status, spec.retriable) == (status, err["retriable"]), body
    if status == 401:
        # schemathesis' Response keeps headers lowercased, each a list of values.
        challenge = response.headers.get("www-authenticate", [""])[0]
        assert challenge.startswith("Bearer"), (response.request.url, body)


def _fuzz_one(case, node):
    token = next(_tokens)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    before = _state(node.url, case)
    try:
        response = case.call(headers=headers, timeout=30)
    except requests.exceptions.ConnectionError as exc:
        pytest.fail(f"the node dropped the connection: {exc}")
    sent["requests"] += 1
    sent["operations"].add(case.operation.label)
    _check_error(response)
    if 400 <= response.status_code < 500:
        sent["refused"] += 1
        assert _state(node.url, case) == before, (
            f"a refused request ({response.status_code} "
            f"{response.json()['error']['code']}) changed state")


def test_fuzzed_requests_get_no_5xx_json_errors_and_refusals_change_nothing(
        fuzz_node, fuzz_schema):
    # Hypothesis driven directly with schemathesis' strategies (its pytest fixture loader
    # does not work with pytest 9): up to EXAMPLES cases per operation, then
    # NEGATIVE_EXAMPLES of data the schema forbids.
    for mode, examples in ((schemathesis.GenerationMode.POSITIVE, EXAMPLES),
                           (schemathesis.GenerationMode.NEGATIVE, NEGATIVE_EXAMPLES)):
        for result in fuzz_schema.get_all_operations():
            operation = result.ok()

            @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                _fuzz_one(case, fuzz_node)

            try:
                run()
            except Unsatisfiable:  # nothing of it can be made invalid (no parameters, no body)
                assert mode == schemathesis.GenerationMode.NEGATIVE, operation.label
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "fuzz.json").write_text(json.dumps(
        {"requests": sent["requests"], "refused": sent["refused"],
         "operations": sorted(sent["operations"])}, indent=2))
    assert sent["requests"] >= 2000, sent


def test_byte_level_mutations_of_valid_requests_get_no_5xx_and_registry_errors(fuzz_node):
    """A seeded run of tests/mutations.py (scripts/fuzz.py runs it longer)."""
    host, port = fuzz_node.url.removeprefix("http://").split(":")
    stream = mutations.requests(random.Random(36), FULL)
    statuses: Counter[int] = Counter()

    async def run():
        for _ in range(MUTATED):
            request = next(stream)
            answer = await mutations.send(host, int(port), request)
            problem = mutations.violation(answer)
            assert problem is None, (problem, request.mutations, request.encode()[:600])
            statuses[answer.status] += 1

    asyncio.run(run())
    sent["requests"] += MUTATED
    assert sum(n for s, n in statuses.items() if 400 <= s < 500) > MUTATED // 2, statuses
    assert statuses[200] > 0, statuses  # mutations that leave a request valid still work
    assert http("GET", f"{fuzz_node.url}/healthz")[0] == 200


def test_after_the_fuzzing_the_node_is_healthy_and_logged_no_crash(fuzz_node, fuzz_schema):
    if sent["requests"] == 0:
        pytest.skip("runs after the fuzzed requests of this module (run the whole file)")
    operations = {op.ok().label for op in fuzz_schema.get_all_operations()}
    assert sent["operations"] == operations  # every route was fuzzed
    assert sent["requests"] >= 2000, sent
    assert http("GET", f"{fuzz_node.url}/healthz")[0] == 200
    assert http("GET", f"{fuzz_node.url}/readyz")[0] == 200
    log = (LOGS / f"{fuzz_node.topics.prefix}-{fuzz_node.node_id}.log").read_text()
    assert not re.search(r"request_crashed|Traceback", log), log[-3000:]
    # The parser's refusals (above) are one warning line each, without a traceback.
