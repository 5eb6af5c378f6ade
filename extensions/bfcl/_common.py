"""Shared argument types and arithmetic helpers of the ``bfcl`` tools.

The BFCL reference functions run plain Python arithmetic on the values they are
given, so these helpers keep a JSON integer an exact ``int`` and a JSON number with a
fraction or exponent a binary64 ``float`` (see FUNCTIONS.md, "Conventions").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BeforeValidator, WithJsonSchema

from toolfleet.shared import ExtensionToolError

__all__ = [
    "Integer",
    "Number",
    "arithmetic_guard",
    "choice",
    "ensure_finite",
    "refuse_beyond_float_range",
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


def choice(*values: str) -> Any:
    """A string parameter with a fixed set of values, declared as an ``enum`` in the schema.

    Matching ignores case and surrounding blanks and gives the canonical value (``"Male"``
    is ``"male"``); anything else is ``invalid_arguments`` listing the allowed values
    (pydantic's ``Input should be 'male', 'female' or 'other'``).

    Args:
        values: the canonical values, in the order the schema lists them.

    Returns:
        An ``Annotated[Literal[...], ...]`` type for a pydantic field.
    """
    canonical = {value.casefold(): value for value in values}

    def match(value: Any) -> Any:
        if isinstance(value, str):
            return canonical.get(value.strip().casefold(), value)
        return value

    literal: Any = Literal.__getitem__(values)
    return Annotated[literal, BeforeValidator(match)]


def refuse_beyond_float_range(log10_value: float, message: str) -> None:
    """Refuse, before computing it, a count whose float would overflow.

    ``math.perm`` and ``math.comb`` of large arguments take seconds of CPU (holding the
    GIL) to build an integer that ``float()`` then refuses; the logarithm from
    ``math.lgamma`` tells in microseconds. Values near the limit (a ``log10`` between
    308.25 and 309) are left to the exact computation, which is cheap there.

    Args:
        log10_value: the base-10 logarithm of the count.
        message: the error message.

    Raises:
        ExtensionToolError: when the count is clearly beyond the double range.
    """
    if log10_value > 309:
        raise ExtensionToolError(message)


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
