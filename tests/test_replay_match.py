"""How replay compares a result with the expected value: within a tolerance, and bit-exact."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from toolfleet.worker.devtools.replay_match import bit_exact, matches


def _nan(payload: int) -> float:
    """A quiet NaN carrying ``payload`` in its low mantissa bits."""
    value: float = struct.unpack("<d", struct.pack("<Q", 0x7FF8_0000_0000_0000 | payload))[0]
    return value


@pytest.mark.parametrize(
    ("actual", "expected"),
    [
        (0.0, -0.0),
        (_nan(1), _nan(2)),
        (-_nan(1), _nan(1)),
        (1, 1.0),
        (True, 1),
        (0.1 + 0.2, 0.3),
        ([1.0, [0.0]], [1.0, [-0.0]]),
        ({"a": 0.0}, {"a": -0.0}),
        ({"a": 1}, {"a": 1, "b": 2}),
    ],
)
def test_not_bit_exact(actual: Any, expected: Any) -> None:
    """The sign of zero, a NaN's sign and payload, the JSON type and the last bit all count."""
    assert not bit_exact(actual, expected)


@pytest.mark.parametrize(
    ("actual", "expected"),
    [
        (-0.0, -0.0),
        (_nan(7), _nan(7)),
        (0.1 + 0.2, 0.30000000000000004),
        ({"x": [1, "a", None, False, 2.5]}, {"x": [1, "a", None, False, 2.5]}),
        (2**70, 2**70),
    ],
)
def test_bit_exact(actual: Any, expected: Any) -> None:
    """Identical JSON values are bit-exact, NaNs of one payload included."""
    assert bit_exact(actual, expected)


def test_matches_takes_floats_within_the_tolerance_and_keeps_types() -> None:
    """Correct (not bit-exact) allows a relative 1e-9 on floats, nothing on types."""
    assert matches(0.1 + 0.2, 0.3) and matches(0.0, -0.0)
    assert not matches(1, 1.0) and not matches(True, 1) and not matches(0.3, 0.31)
