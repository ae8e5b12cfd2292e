"""The MD5 digests SQS answers beside a message (MD5OfMessageBody, MD5OfMessageAttributes,
MD5OfMessageSystemAttributes), which the AWS SDKs for Java, JavaScript, Go, Ruby and PHP check
by default. The system attributes' digest is the attributes' algorithm over them (the SDKs
compute it so).

The attributes' digest follows AWS's documented algorithm ("Calculating the MD5 message digest
for message attributes", SQS Developer Guide): for each attribute, sorted by name, the name,
its data type and its value, each as a 4-byte big-endian length and its bytes, with one byte
between type and value saying how the value travels (1: a string, 2: binary)."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

STRING_TRANSPORT = 1
BINARY_TRANSPORT = 2


@dataclass(slots=True, frozen=True)
class MessageAttribute:
    """A message attribute: `data_type` is String, Number or Binary, maybe with a custom
    suffix (`Number.int`); a Binary one holds `binary`, the others `string`."""

    data_type: str
    string: str | None = None
    binary: bytes | None = None

    @property
    def is_binary(self) -> bool:
        return self.data_type == "Binary" or self.data_type.startswith("Binary.")

    def value_bytes(self) -> bytes:
        if self.is_binary:
            return self.binary or b""
        return (self.string or "").encode("utf-8")


def md5_of_body(body: str) -> str:
    return hashlib.md5(body.encode("utf-8")).hexdigest()


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def md5_of_attributes(attributes: Mapping[str, MessageAttribute]) -> str:
    """MD5OfMessageAttributes of `attributes` (give it only those the answer carries)."""
    digest = hashlib.md5()
    for name in sorted(attributes):
        a = attributes[name]
        digest.update(_field(name.encode("utf-8")))
        digest.update(_field(a.data_type.encode("utf-8")))
        digest.update(bytes([BINARY_TRANSPORT if a.is_binary else STRING_TRANSPORT]))
        digest.update(_field(a.value_bytes()))
    return digest.hexdigest()
