"""Shared argument types and arithmetic helpers of the ``bfcl`` tools.

The BFCL reference functions run plain Python arithmetic on the values they are
given, so these helpers keep a JSON integer an exact ``int`` and a JSON number with a
fraction or exponent a binary64 ``float`` (see FUNCTIONS.md, "Conventions").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypeVar

from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

from toolfleet.shared import ExtensionToolError

__all__ = [
    "Integer",
    "Number",
    "arithmetic_guard",
    "ensure_finite",
    "sum_in_order",
]


_T = TypeVar("_T")


def _reject_bool(value: Any) -> Any:
    """Refuse JSON booleans where a number is expected (pydantic's lax mode takes them)."""
    if isinstance(value, bool):
        raise ValueError("expected a number, not a boolean")
    return value


def _reject_non_finite(value: int | float) -> int | float:
    """Refuse NaN and the infinities, which JSON cannot carry."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


Integer = Annotated[int, BeforeValidator(_reject_bool)]
"""A JSON integer, kept as an exact Python ``int`` of any size."""

Number = Annotated[
    int | float,
    BeforeValidator(_reject_bool),
    AfterValidator(_reject_non_finite),
    WithJsonSchema({"type": "number"}),
]
"""A JSON number: an integer stays an exact ``int``, anything else is a ``float``.

Keeping integers exact reproduces the reference's result types (``5 + 2 * 10`` is the
integer ``25``, while ``0 + 9.8 * 12`` is a double).
"""


def sum_in_order(values: Iterable[int | float]) -> int | float:
    """Add values left to right from the integer zero, with no compensation.

    Args:
        values: the numbers to add, in the order they are added.

    Returns:
        The plain running sum (an ``int`` while every value is an ``int``).
    """
    total: int | float = 0
    for value in values:
        total = total + value
    return total


@contextmanager
def arithmetic_guard(overflow: str, zero_division: str | None = None) -> Iterator[None]:
    """Turn arithmetic failures inside the block into :class:`ExtensionToolError`.

    Args:
        overflow: the message for an ``OverflowError`` (a value beyond the double range).
        zero_division: the message for a ``ZeroDivisionError``; defaults to ``overflow``.

    Raises:
        ExtensionToolError: when the block raises ``OverflowError`` or
            ``ZeroDivisionError``.
    """
    try:
        yield
    except OverflowError as exc:
        raise ExtensionToolError(overflow) from exc
    except ZeroDivisionError as exc:
        raise ExtensionToolError(zero_division or overflow) from exc


def ensure_finite(value: _T, message: str) -> _T:
    """Return ``value`` unchanged if every float in it is finite.

    Args:
        value: a JSON value (numbers, strings, lists and dicts of them).
        message: the error message when a float is NaN or infinite.

    Returns:
        ``value`` itself.

    Raises:
        ExtensionToolError: when ``value`` holds a NaN or an infinity (JSON cannot
            carry them).
    """
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ExtensionToolError(message)
    elif isinstance(value, list):
        for item in value:
            ensure_finite(item, message)
    elif isinstance(value, dict):
        for item in value.values():
            ensure_finite(item, message)
    return value
