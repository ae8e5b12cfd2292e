"""The outbox helper refuses what the node would: its tag rule is the node's, and a record it
lets through passes the node's tag check."""

from __future__ import annotations

import pytest
from vqueues_client import VQError, outbox

from vqueues.state.tags import TAG_PATTERN, check_tag

pytestmark = pytest.mark.unit

TAGS = ["red", " red", "red ", "a,b", "", "x" * 64, "x" * 65, "é" * 32, "é" * 33, "a b",
        "red\t", "\u3000red", "r\u0085", "ok-1"]


def test_the_tag_rule_is_the_nodes():
    assert outbox._TAG.pattern == TAG_PATTERN
    for tag in TAGS:
        try:
            outbox.check("q", "v", tags=[tag])
            refused = False
        except VQError as exc:
            assert exc.code == "invalid_record"
            refused = True
        assert refused == (check_tag(tag) is not None), tag


def test_check_refuses_what_the_node_refuses():
    with pytest.raises(VQError, match="invalid_name"):
        outbox.check("", "v")
    with pytest.raises(VQError, match="record_too_large"):
        outbox.check("q", b"x" * 11, max_record_bytes=10)
    with pytest.raises(VQError, match="delay_ms or deliver_at"):
        outbox.check("q", "v", delay_ms=1, deliver_at=2)
    outbox.check("q", None, headers={"a": "b"}, tags=["t"], ordering_key="k",
                 idempotency_key="k" * 256, delay_ms=0)
