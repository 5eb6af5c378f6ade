"""The wire codec: exact numbers, odd text, clear decode errors."""

from __future__ import annotations

import json

import pytest

from toolfleet.shared import codec


@pytest.mark.parametrize("value", [2**64, -(2**70), 10**40 + 1, [1, {"x": 2**100}]])
def test_integers_beyond_64_bits_round_trip_exactly(value: object) -> None:
    """An integer orjson refuses is still written as a JSON number and read back exact."""
    data = codec.dumps(value)
    assert json.loads(data) == value
    assert codec.loads(data) == value


def test_nineteen_digit_float_fraction_still_decodes_as_float() -> None:
    """The big-integer fallback does not turn long float fractions into something else."""
    assert codec.loads(b"0.1234567890123456789") == 0.1234567890123456789


def test_lone_surrogate_never_crashes_the_encoder() -> None:
    """Text with a lone surrogate encodes (as an escape) instead of raising."""
    data = codec.dumps({"s": "a\ud800b"})
    assert b"\\ud800" in data
    assert codec.loads(data) == {"s": "a\ud800b"}


def test_decode_error_says_where() -> None:
    """A truncated document raises DecodeError naming line and column."""
    with pytest.raises(codec.DecodeError, match="column"):
        codec.loads('{"a": 450, "b": 3')


def test_unencodable_value_raises_encode_error() -> None:
    """An object JSON cannot carry raises EncodeError, a TypeError."""
    with pytest.raises(codec.EncodeError):
        codec.dumps({"x": object()})
