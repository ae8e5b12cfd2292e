"""Narrowing for the type checker where a test knows a value is there."""

from __future__ import annotations

import asyncio
from typing import Any, TypeVar

T = TypeVar("T")
E = TypeVar("E", bound=BaseException)


def known(value: T | None) -> T:
    """`value`, which the test expects present: fails the test (as using None would) if not."""
    assert value is not None
    return value


def failed_with(future: asyncio.Future[Any], kind: type[E]) -> E:
    """The exception `future` failed with, which the test expects to be a `kind`: fails the
    test (as using its attributes would) if it is not."""
    err = future.exception()
    assert isinstance(err, kind), err
    return err
