"""Compare a tool's result with an expected JSON value (how replay decides "correct")."""

from __future__ import annotations

import math
import struct
from typing import Any

__all__ = ["REL_TOL", "bit_exact", "matches"]

#: Relative tolerance for floats (integers compare exactly).
REL_TOL = 1e-9


def matches(actual: Any, expected: Any, rel_tol: float = REL_TOL) -> bool:
    """True when ``actual`` equals ``expected``.

    Same JSON types, integers and strings exact, floats within ``rel_tol``, lists and
    objects element by element.
    """
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, int) and isinstance(actual, int):
        return actual == expected
    if isinstance(expected, float) and isinstance(actual, (int, float)):
        if math.isnan(expected):
            return isinstance(actual, float) and math.isnan(actual)
        return isinstance(actual, float) and math.isclose(actual, expected, rel_tol=rel_tol)
    if isinstance(expected, list) and isinstance(actual, list):
        return len(actual) == len(expected) and all(
            matches(a, e, rel_tol) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(expected, dict) and isinstance(actual, dict):
        return actual.keys() == expected.keys() and all(
            matches(actual[k], v, rel_tol) for k, v in expected.items()
        )
    return type(actual) is type(expected) and bool(actual == expected)


def bit_exact(actual: Any, expected: Any) -> bool:
    """True when ``actual`` is ``expected`` to the last bit.

    Same JSON types (a boolean is not a number, ``1`` is not ``1.0``), integers and
    strings equal, floats identical in all 64 bits: ``-0.0`` is not ``0.0``, a NaN is
    bit-exact only to a NaN with the same sign and payload. Lists and objects element by
    element.
    """
    if isinstance(expected, bool) or isinstance(actual, bool):
        return type(actual) is type(expected) and actual == expected
    if isinstance(expected, float) or isinstance(actual, float):
        return (
            isinstance(actual, float)
            and isinstance(expected, float)
            and (_bits(actual) == _bits(expected))
        )
    if isinstance(expected, list) and isinstance(actual, list):
        return len(actual) == len(expected) and all(
            bit_exact(a, e) for a, e in zip(actual, expected, strict=True)
        )
    if isinstance(expected, dict) and isinstance(actual, dict):
        return actual.keys() == expected.keys() and all(
            bit_exact(actual[k], v) for k, v in expected.items()
        )
    return type(actual) is type(expected) and bool(actual == expected)


def _bits(value: float) -> bytes:
    return struct.pack("<d", value)
