"""The wire codec: exact numbers, odd text, clear decode errors."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable

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


def _nested(depth: int, leaf: object) -> object:
    value = leaf
    for _ in range(depth):
        value = {"a": value}
    return value


def _unnested(value: object, depth: int) -> object:
    """The leaf of ``depth`` nested ``{"a": ...}`` objects (compared without recursion)."""
    for _ in range(depth):
        assert isinstance(value, dict) and list(value) == ["a"]
        value = value["a"]
    return value


#: Leaves that send a document down each path: orjson, big integers, lone surrogates.
LEAVES = [1, 2**70, "\ud800"]


@pytest.mark.parametrize("leaf", LEAVES, ids=["orjson", "big-int", "surrogate"])
def test_both_directions_accept_exactly_the_depth_bound(leaf: object) -> None:
    """A document nested 1,024 levels encodes and decodes back whichever encoder handles
    it; one nested 1,025 levels is refused by both, saying so."""
    text = codec.dumps(_nested(1024, leaf))
    assert _unnested(codec.loads(text), 1024) == leaf
    deeper = b'{"a":' + text + b"}"
    with pytest.raises(codec.EncodeError, match="deeper than 1024 levels"):
        codec.dumps(_nested(1025, leaf))
    with pytest.raises(codec.DecodeError, match="deeper than 1024 levels"):
        codec.loads(deeper)


def _at_stack_depth(frames: int, then: Callable[[], object]) -> object:
    return then() if frames == 0 else _at_stack_depth(frames - 1, then)


@pytest.mark.parametrize("leaf", LEAVES, ids=["orjson", "big-int", "surrogate"])
def test_depth_bound_does_not_depend_on_the_call_stack_or_recursion_limit(leaf: object) -> None:
    """Deep inside a call stack a document at the bound still encodes and decodes, and
    with the recursion limit raised (as a host application may) one past it is still
    refused."""
    at_bound = _nested(1024, leaf)
    text = _at_stack_depth(700, lambda: codec.dumps(at_bound))
    assert isinstance(text, bytes)
    assert _unnested(_at_stack_depth(700, lambda: codec.loads(text)), 1024) == leaf
    previous = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        with pytest.raises(codec.EncodeError, match="deeper than 1024 levels"):
            codec.dumps(_nested(1100, leaf))
        with pytest.raises(codec.DecodeError, match="deeper than 1024 levels"):
            codec.loads('{"a":' * 1100 + json.dumps(leaf) + "}" * 1100)
    finally:
        sys.setrecursionlimit(previous)
    assert sys.getrecursionlimit() == previous
