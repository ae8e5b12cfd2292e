"""Authentication and authorisation (docs/security.md): bearer tokens with scopes per queue-name
prefix.

A token is either an entry of the token file (only its SHA-256 is stored; the file is reloaded
when it changes) or a signed JWT (PyJWT: HS256 with a shared secret, RS256/ES256 with a public
key). Either way it grants scopes, each a list of queue-name prefixes:
  read   read records, lease, complete/retry/extend, ack, stream, queue and consumer info
  write  enqueue, cancel a scheduled record
  admin  delete queues and consumers, consumer settings, the queue listing
A valid token may read the cluster map (clients route with it).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vqueues.api.sqs.paths import SQS_ROUTES
from vqueues.errors import VQError

if TYPE_CHECKING:
    from jwt.types import Options

log = logging.getLogger(__name__)

SCOPES = ("read", "write", "admin")


@dataclass(frozen=True)
class Identity:
    """Who is calling, and the queue-name prefixes each scope reaches."""

    name: str
    scopes: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def allows(self, scope: str, queue: str) -> bool:
        return any(queue.startswith(prefix) for prefix in self.scopes.get(scope, ()))


def parse_scopes(raw: Any) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict):
        raise ValueError("scopes must be an object of scope -> list of queue-name prefixes")
    out: dict[str, tuple[str, ...]] = {}
    for scope, prefixes in raw.items():
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}; scopes are {SCOPES}")
        if not isinstance(prefixes, list) or not all(isinstance(p, str) for p in prefixes):
            raise ValueError(f"scope {scope!r} must list queue-name prefixes")
        out[scope] = tuple(prefixes)
    return out


def token_hash(token: str) -> str:
    """What the token file stores of a token: its SHA-256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


class TokenFile:
    """`{"tokens": [{"name": ..., "sha256": ..., "scopes": {...}}]}`, reloaded on change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mtime = -1.0
        self._entries: list[tuple[bytes, Identity]] = []
        self.reload()

    def reload(self) -> bool:
        """Read the file again if it changed; True if it did. A bad file keeps the old one."""
        try:
            mtime = os.stat(self.path).st_mtime
        except OSError as exc:
            log.error("token_file_unreadable", extra={"path": self.path, "error": str(exc)})
            return False
        if mtime == self._mtime:
            return False
        try:
            with open(self.path, encoding="utf-8") as f:
                body = json.load(f)
            entries = [(bytes.fromhex(e["sha256"]), Identity(str(e["name"]),
                                                              parse_scopes(e.get("scopes", {}))))
                       for e in body["tokens"]]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("token_file_invalid", extra={"path": self.path, "error": str(exc)})
            return False
        self._entries, self._mtime = entries, mtime
        log.info("token_file_loaded", extra={"path": self.path, "tokens": len(entries)})
        return True

    def identify(self, token: str) -> Identity | None:
        digest = hashlib.sha256(token.encode()).digest()
        found = None
        for stored, identity in self._entries:  # every entry compared, in constant time
            if hmac.compare_digest(stored, digest):
                found = identity
        return found


class Authenticator:
    """Turns an `Authorization: Bearer` header into an Identity (or a 401)."""

    def __init__(self, token_file: str = "", jwt_secret: str = "", jwt_public_key: str = "",
                 jwt_audience: str = "", jwt_allow_no_exp: bool = False,
                 sqs_keys: bool = False) -> None:
        self.tokens = TokenFile(token_file) if token_file else None
        self.jwt_secret = jwt_secret
        self.jwt_key = ""
        if jwt_public_key:
            with open(jwt_public_key, encoding="utf-8") as f:
                self.jwt_key = f.read()
        self.jwt_audience = jwt_audience or None
        # PyJWT checks `exp` only when present; a token without one would never expire.
        self.jwt_options: Options = {"require": [] if jwt_allow_no_exp else ["exp"]}
        if self.jwt_secret or self.jwt_key:
            import jwt  # noqa: F401  PyJWT (and cryptography) are slow to import: only when used
        if not (self.tokens or self.jwt_secret or self.jwt_key or sqs_keys):
            raise ValueError("auth is on but no token file, JWT secret, JWT public key or SQS "
                             "access key file is set")

    def identify(self, header: str | None) -> Identity:
        if not header or not header.startswith("Bearer "):
            raise VQError("unauthenticated", "this node needs `Authorization: Bearer <token>`")
        token = header[len("Bearer "):].strip()
        if token.count(".") == 2 and (self.jwt_secret or self.jwt_key):
            return self._from_jwt(token)
        identity = self.tokens.identify(token) if self.tokens is not None else None
        if identity is None:
            raise VQError("unauthenticated", "the token is not known")
        return identity

    def _from_jwt(self, token: str) -> Identity:
        import jwt  # imported at start already (above): a look-up here

        try:
            header = jwt.get_unverified_header(token)
            alg = header.get("alg")
            if alg == "HS256" and self.jwt_secret:
                claims = jwt.decode(token, self.jwt_secret, algorithms=["HS256"],
                                    audience=self.jwt_audience, options=self.jwt_options)
            elif alg in ("RS256", "ES256") and self.jwt_key:
                claims = jwt.decode(token, self.jwt_key, algorithms=[alg],
                                    audience=self.jwt_audience, options=self.jwt_options)
            else:
                raise VQError("unauthenticated", f"JWT algorithm {alg!r} is not accepted here")
            return Identity(str(claims.get("sub", "jwt")), parse_scopes(claims.get("scopes", {})))
        except VQError:
            raise
        except (jwt.PyJWTError, ValueError) as exc:
            raise VQError("unauthenticated", f"the token is not valid: {exc}") from None


def required_scope(route: str, method: str) -> str | None:
    """The scope a route needs (on its queue), "any" for any valid token, None if public."""
    if route in ("/healthz", "/readyz", "/v1/openapi.json") or route.startswith("/ui"):
        return None  # the console's files are public; what they fetch needs a token
    if route in SQS_ROUTES:
        return None  # SQS's own auth: the route answers it in SQS's shape (api/sqs/route.py)
    if route == "/metrics":
        return "metrics"
    if route in ("/v1/partitions", "/get_partitions"):
        return "any"
    if route == "/v1/queues":
        return "admin"
    if route.endswith("/records"):
        return "write" if method == "POST" else "read"
    if "/scheduled/" in route:
        return "write"
    if route.endswith(("/lease", "/complete", "/retry", "/extend", "/ack", "/stream")) or \
            route in ("/get_records", "/consumer_ack"):
        return "read"
    if method in ("DELETE", "PUT"):
        return "admin"
    if method == "GET":
        return "read"
    return "admin"
