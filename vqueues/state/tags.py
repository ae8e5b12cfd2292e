"""Tags: a few short strings a record carries in its `vq-tags` header (comma-separated), which
the owner indexes per queue so reads, leases and streams can filter by tag without scanning the
queue (docs/api.md#tags)."""

from __future__ import annotations

import re
from collections.abc import Sequence

TAGS_HEADER = "vq-tags"
MAX_TAGS = 8
MAX_TAG_BYTES = 64
# What `str.strip()` strips (str.isspace), spelt out so that the OpenAPI document's pattern, an
# ECMA-262 regex whose `\s` differs, states the very rule the node applies.
_SPACE = ("\\t\\n\\v\\f\\r \\x1c-\\x1f\\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029"
          "\\u202f\\u205f\\u3000")
TAG_PATTERN = f"^[^,{_SPACE}](?:[^,]*[^,{_SPACE}])?$"
_TAG = re.compile(TAG_PATTERN)


def tags_of(headers: Sequence[tuple[str, bytes | None]]) -> list[str]:
    """The record's tags (empty ones dropped, at most MAX_TAGS, each cut to MAX_TAG_BYTES)."""
    for name, value in headers:
        if name == TAGS_HEADER and value:
            text = value.decode("utf-8", "replace")
            seen = dict.fromkeys(t.strip()[:MAX_TAG_BYTES] for t in text.split(","))
            return [t for t in seen if t][:MAX_TAGS]
    return []


def check_tag(tag: str) -> str | None:
    """Why `tag` cannot be a tag, or None if it can."""
    if not _TAG.fullmatch(tag):
        return "a tag is a non-empty string without commas or surrounding spaces"
    if len(tag.encode("utf-8", "surrogatepass")) > MAX_TAG_BYTES:
        return f"a tag is at most {MAX_TAG_BYTES} UTF-8 bytes"
    return None
