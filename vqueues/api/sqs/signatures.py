"""AWS Signature Version 4 on SQS calls, verified against the access key file (docs/sqs.md,
docs/security.md): `{"keys": [{"id", "secret", "name", "scopes"}]}`, the secrets in plain
text (SigV4's HMAC needs the secret itself, where the token file keeps only hashes), in a
file only its owner may read, reloaded when it changes.

The signature is computed again from the request as received: the canonical request
(method, path, query, the signed headers, the SHA-256 of the body as read), the string to
sign over the credential's date, region and service, and the key derived from the secret;
see AWS's "Create a signed AWS API request" (IAM User Guide). A call another node sent on
is verified by the Host it was sent to (X-Forwarded-Host), which the signature covers."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import quote, unquote

from vqueues.api.auth import Identity, parse_scopes
from vqueues.api.sqs.protocol import SqsError

log = logging.getLogger(__name__)

ALGORITHM = "AWS4-HMAC-SHA256"
SERVICE = "sqs"
MAX_SKEW_S = 15 * 60
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256\s+Credential=([^,\s]+)\s*,\s*SignedHeaders=([^,\s]+)\s*,\s*"
    r"Signature=([0-9a-f]{64})\s*$")
_SPACES = re.compile(r"\s+")


@dataclass(frozen=True, slots=True)
class AccessKey:
    secret: str
    identity: Identity


class AccessKeyFile:
    """The access keys by id, read again when the file changes. A file that does not parse,
    or that others than its owner may read or write, is refused (logged) and the keys read
    before stay."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._mtime = -1.0
        self.keys: dict[str, AccessKey] = {}
        self.reload()

    def reload(self) -> bool:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            log.error("access_key_file_unreadable", extra={"path": self.path,
                                                           "error": str(exc)})
            return False
        if st.st_mtime == self._mtime:
            return False
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.error("access_key_file_exposed", extra={
                "path": self.path, "mode": oct(st.st_mode & 0o777),
                "error": "the file holds secrets: chmod 600 it (group and others may not "
                         "read or write it)"})
            return False
        try:
            with open(self.path, encoding="utf-8") as f:
                body = json.load(f)
            keys = {}
            for e in body["keys"]:
                key_id, secret = e["id"], e["secret"]
                if not isinstance(key_id, str) or not key_id or not isinstance(secret, str) \
                        or not secret:
                    raise ValueError("each key needs a non-empty id and secret")
                keys[key_id] = AccessKey(secret, Identity(str(e.get("name", key_id)),
                                                          parse_scopes(e.get("scopes", {}))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.error("access_key_file_invalid", extra={"path": self.path, "error": str(exc)})
            return False
        self.keys, self._mtime = keys, st.st_mtime
        log.info("access_key_file_loaded", extra={"path": self.path, "keys": len(keys)})
        return True


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def signing_key(secret: str, date: str, region: str, service: str = SERVICE) -> bytes:
    k = _hmac(("AWS4" + secret).encode("utf-8"), date)
    return _hmac(_hmac(_hmac(k, region), service), "aws4_request")


def _encode(text: str) -> str:
    return quote(unquote(text), safe="-_.~")


def canonical_query(query: str) -> str:
    pairs = []
    for part in query.split("&") if query else ():
        name, _, value = part.partition("=")
        pairs.append((_encode(name.replace("+", " ")), _encode(value.replace("+", " "))))
    return "&".join(f"{n}={v}" for n, v in sorted(pairs))


def canonical_request(method: str, raw_path: str, query: str,
                      headers: Mapping[str, list[str]], signed: list[str], body: bytes) -> str:
    """SigV4's canonical request; `headers` by lower-case name, each with its values."""
    lines = [f"{name}:{','.join(_SPACES.sub(' ', v.strip()) for v in headers[name])}\n"
             for name in signed]
    # The path as sent, URI-encoded once more (SigV4 for services other than S3).
    return "\n".join([method, quote(raw_path or "/", safe="/~"), canonical_query(query),
                      "".join(lines), ";".join(signed), hashlib.sha256(body).hexdigest()])


def key_id_of(authorization: str) -> str | None:
    """The access key id a SigV4 Authorization header names (verified or not: `verify` says
    whether the signature is that key's), or None if it is no such header."""
    match = _AUTHORIZATION.match(authorization.strip())
    if match is None:
        return None
    parts = match.group(1).split("/")
    return parts[0] if len(parts) == 5 and parts[0] else None


def verify(keys: Mapping[str, AccessKey], method: str, raw_path: str, query: str,
           headers: Mapping[str, list[str]], body: bytes, now: dt.datetime) -> Identity:
    """The caller's identity, once the request's signature is the one its secret makes;
    SQS's errors otherwise."""
    header = (headers.get("authorization") or [""])[0]
    if not header:
        raise SqsError("MissingAuthenticationToken", "Request is missing Authentication Token")
    match = _AUTHORIZATION.match(header.strip())
    if match is None:
        raise SqsError("IncompleteSignature", f"the Authorization header is not an "
                       f"{ALGORITHM} signature with Credential, SignedHeaders and Signature")
    credential, signed_text, signature = match.groups()
    parts = credential.split("/")
    if len(parts) != 5 or parts[3] != SERVICE or parts[4] != "aws4_request":
        raise SqsError("IncompleteSignature", "the credential must be "
                       "<key id>/<date>/<region>/sqs/aws4_request")
    key_id, date, region = parts[0], parts[1], parts[2]
    key = keys.get(key_id)
    if key is None:
        raise SqsError("InvalidClientTokenId", "The security token included in the request "
                       "is invalid.")
    stamp = (headers.get("x-amz-date") or [""])[0]
    try:
        at = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        raise SqsError("IncompleteSignature", "X-Amz-Date must be given as "
                       "YYYYMMDDTHHMMSSZ") from None
    if abs((now - at).total_seconds()) > MAX_SKEW_S:
        raise SqsError("SignatureDoesNotMatch", f"Signature expired: {stamp} is more than 15 "
                       "minutes from the node's time")
    signed = signed_text.split(";")
    if stamp[:8] != date or "host" not in signed or signed != sorted(signed) or any(
            name not in headers for name in signed):
        raise SqsError("SignatureDoesNotMatch", "the signed headers must include host, be "
                       "sorted and be present, and the credential's date must be X-Amz-Date's")
    request = canonical_request(method, raw_path, query, headers, signed, body)
    scope = f"{date}/{region}/{SERVICE}/aws4_request"
    to_sign = "\n".join([ALGORITHM, stamp, scope,
                         hashlib.sha256(request.encode("utf-8")).hexdigest()])
    expected = hmac.new(signing_key(key.secret, date, region), to_sign.encode("utf-8"),
                        hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, signature):
        raise SqsError("SignatureDoesNotMatch", "The request signature we calculated does not "
                       "match the signature you provided. Check your AWS Secret Access Key "
                       "and signing method.")
    return key.identity
