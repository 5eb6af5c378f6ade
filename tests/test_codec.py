"""The wire codec: exact numbers, odd text, clear decode errors."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable

import pytest

from conftest import Fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import codec


@pytest.mark.parametrize("value", [2**64, -(2**70), 10**40 + 1, [1, {"x": 2**100}]])
def test_integers_beyond_64_bits_round_trip_exactly(value: object) -> None:
    """An integer orjson refuses is still written as a JSON number and read back exact."""
    data = codec.dumps(value)
    assert json.loads(data) == value
    assert codec.loads(data) == value


def _digits(value: int) -> str:
    """``str(value)`` with Python's digit limit lifted for this one conversion (the
    expected text, computed without the codec)."""
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return str(value)
    finally:
        sys.set_int_max_str_digits(previous)


def test_an_integer_past_pythons_digit_limit_prints_and_re_encodes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """factorial(1700) has 4,756 digits, past Python's int/str limit (4,300): decoded, it
    is still that int, and it prints (str, repr, f-string, inside a list) and re-encodes
    with every digit, without the process's digit limit being changed."""
    value = math.factorial(1700)
    digits = _digits(value)
    limit = sys.get_int_max_str_digits()
    assert len(digits) == 4756 and 0 < limit < len(digits)
    data = f'{{"n": {digits}, "list": [-{digits}]}}'.encode()
    decoded = codec.loads(data)
    n = decoded["n"]
    assert isinstance(n, int) and n == value and decoded["list"] == [-value]
    print(n)
    print(decoded)
    assert capsys.readouterr().out == f"{digits}\n{{'n': {digits}, 'list': [-{digits}]}}\n"
    assert f"{n}" == str(n) == repr(n) == digits
    assert (
        codec.dumps(decoded) == b'{"n":' + digits.encode() + b',"list":[-' + digits.encode() + b"]}"
    )
    assert n + 1 == value + 1 and type(n + 1) is int  # arithmetic gives plain ints
    assert sys.get_int_max_str_digits() == limit


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


def test_a_factorial_of_1700_prints_as_the_readme_prints_a_result(
    fleet: Fleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's ``print(result.status, result.content)`` for factorial(1700) through a
    real fleet prints every digit; a turn's message re-encodes it exactly."""
    digits = _digits(math.factorial(1700))
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        result = client.call("ext_bfcl_math_factorial", '{"n": 1700}', timeout_s=30)
        print(result.status, result.content)
        assert capsys.readouterr().out == f"ok {digits}\n"
        function = {"name": "ext_bfcl_math_factorial", "arguments": '{"n": 1700}'}
        call = {"id": "c1", "type": "function", "function": function}
        (message,) = client.dispatch([call], timeout_s=30)
    assert message["content"] == digits
