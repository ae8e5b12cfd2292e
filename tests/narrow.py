"""Narrowing for the type checker where a test knows a value is there."""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")


def known(value: T | None) -> T:
    """`value`, which the test expects present: fails the test (as using None would) if not."""
    assert value is not None
    return value
