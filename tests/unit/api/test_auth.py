"""Tokens and scopes without a node: the token file (hashed, reloaded on change), JWTs (HS256,
RS256, ES256), scopes per queue-name prefix, and which scope each route needs."""

import json
import os
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.narrow import known
from vqueues.api.auth import Authenticator, Identity, TokenFile, required_scope, token_hash
from vqueues.errors import VQError

pytestmark = pytest.mark.unit


def write_tokens(path, *entries):
    path.write_text(json.dumps({"tokens": [
        {"name": n, "sha256": token_hash(t), "scopes": s} for n, t, s in entries]}))


def test_the_token_file_stores_hashes_and_is_reloaded_when_it_changes(tmp_path):
    f = tmp_path / "tokens.json"
    write_tokens(f, ("ops", "s3cret", {"admin": [""]}))
    tokens = TokenFile(str(f))
    assert "s3cret" not in f.read_text()
    assert known(tokens.identify("s3cret")).name == "ops"
    assert tokens.identify("wrong") is None
    write_tokens(f, ("app", "other", {"write": ["tenant/a/"]}))
    os.utime(f, (time.time() + 5, time.time() + 5))
    assert tokens.reload()
    assert tokens.identify("s3cret") is None and known(tokens.identify("other")).name == "app"
    f.write_text("{not json")
    os.utime(f, (time.time() + 10, time.time() + 10))
    assert not tokens.reload()  # a bad file keeps the tokens it had
    assert known(tokens.identify("other")).name == "app"


def test_scopes_reach_queues_by_prefix():
    who = Identity("t", {"read": ("tenant/a/",), "admin": ("",)})
    assert who.allows("read", "tenant/a/jobs") and not who.allows("read", "tenant/b/jobs")
    assert not who.allows("write", "tenant/a/jobs")
    assert who.allows("admin", "anything")


def test_jwts_are_checked_by_algorithm_key_expiry_and_audience(tmp_path):
    auth = Authenticator(jwt_secret="k" * 32, jwt_audience="vq")
    exp = int(time.time()) + 600
    good = jwt.encode({"sub": "svc", "aud": "vq", "scopes": {"write": ["x/"]}, "exp": exp},
                      "k" * 32, algorithm="HS256")
    who = auth.identify(f"Bearer {good}")
    assert who.name == "svc" and who.allows("write", "x/1")
    for bad in (jwt.encode({"aud": "vq", "exp": 1}, "k" * 32, algorithm="HS256"),
                jwt.encode({"aud": "vq"}, "k" * 32, algorithm="HS256"),  # no exp: never expires
                jwt.encode({"aud": "other", "exp": exp}, "k" * 32, algorithm="HS256"),
                jwt.encode({"aud": "vq", "exp": exp}, "wrong" * 8, algorithm="HS256")):
        with pytest.raises(VQError) as err:
            auth.identify(f"Bearer {bad}")
        assert (err.value.code, err.value.status) == ("unauthenticated", 401)
    for key, alg in ((rsa.generate_private_key(65537, 2048), "RS256"),
                     (ec.generate_private_key(ec.SECP256R1()), "ES256")):
        pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
        (tmp_path / alg).write_bytes(pem)
        auth = Authenticator(jwt_public_key=str(tmp_path / alg))
        token = jwt.encode({"sub": alg, "scopes": {"read": [""]}, "exp": exp}, key,
                           algorithm=alg)
        assert auth.identify(f"Bearer {token}").name == alg
        with pytest.raises(VQError):  # a shared-secret token is not accepted by a key
            auth.identify("Bearer " + jwt.encode({}, "s" * 32, algorithm="HS256"))


def test_a_jwt_without_exp_passes_only_where_a_setting_allows_it():
    forever = jwt.encode({"sub": "old", "scopes": {"read": [""]}}, "k" * 32, algorithm="HS256")
    with pytest.raises(VQError) as err:
        Authenticator(jwt_secret="k" * 32).identify(f"Bearer {forever}")
    assert err.value.code == "unauthenticated" and "exp" in err.value.message
    allowing = Authenticator(jwt_secret="k" * 32, jwt_allow_no_exp=True)
    assert allowing.identify(f"Bearer {forever}").name == "old"
    expired = jwt.encode({"sub": "old", "exp": 1}, "k" * 32, algorithm="HS256")
    with pytest.raises(VQError):  # an `exp` that is there is still enforced
        allowing.identify(f"Bearer {expired}")


def test_a_missing_or_malformed_header_is_401():
    auth = Authenticator(jwt_secret="k" * 32)
    for header in (None, "", "Basic abc", "Bearer nope"):
        with pytest.raises(VQError) as err:
            auth.identify(header)
        assert err.value.status == 401


def test_each_route_needs_its_scope():
    q = "/v1/queues/{queue}"
    c = q + "/consumers/{consumer}"
    assert required_scope("/healthz", "GET") is None
    assert required_scope("/readyz", "GET") is None
    assert required_scope("/metrics", "GET") == "metrics"
    assert required_scope("/v1/partitions", "GET") == "any"
    assert required_scope("/v1/queues", "GET") == "admin"
    assert required_scope(q + "/records", "POST") == "write"
    assert required_scope(q + "/records", "GET") == "read"
    assert required_scope(q + "/scheduled/{id}", "DELETE") == "write"
    for action in ("lease", "complete", "retry", "extend", "ack", "stream"):
        assert required_scope(f"{c}/{action}", "POST") == "read"
    assert required_scope(q, "GET") == "read"
    assert required_scope(q, "DELETE") == "admin"
    assert required_scope(c, "PUT") == "admin"
    assert required_scope(c, "DELETE") == "admin"
