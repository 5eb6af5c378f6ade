"""JSON encoding for everything on the wire (orjson, exact).

orjson refuses integers beyond 64 bits and strings holding lone surrogates; for
such a payload the standard library encodes it instead, so ``factorial(30)`` still
travels as a JSON number and odd text never crashes an encoder. Decoding uses
orjson and falls back to the standard library for the same cases.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import orjson

__all__ = ["DecodeError", "EncodeError", "dumps", "dumps_str", "loads"]

# orjson decodes integers beyond 64 bits as floats (losing digits); a run of 19 or more
# digits that is not a fraction sends the document to the standard library, which keeps
# them exact (the fraction digits of a float like 0.00028014183044433594 do not).
_LONG_DIGITS_BYTES = re.compile(rb"(?<![.\d])\d{19}")
_LONG_DIGITS_STR = re.compile(r"(?<![.\d])\d{19}")


class DecodeError(ValueError):
    """The bytes are not one JSON document. ``str(error)`` says where parsing stopped."""


class EncodeError(TypeError):
    """The value holds something JSON cannot carry (a set, an object, NaN is allowed)."""


def _default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def dumps(value: Any) -> bytes:
    r"""Encode ``value`` as compact UTF-8 JSON.

    Args:
        value: any JSON value; pydantic models and tuples/sets are converted.

    Returns:
        The JSON document as bytes. Integers of any size are written with every digit;
        lone surrogates are written as ``\\udXXX`` escapes.

    Raises:
        EncodeError: the value holds something that is not JSON, NaN or Infinity (JSON
            has no such numbers), or is nested too deeply.
    """
    try:
        data = orjson.dumps(value, default=_default)
    except (orjson.JSONEncodeError, TypeError):
        pass
    else:
        # orjson writes NaN and Infinity as null; refuse them instead of changing the value
        if b"null" in data and _has_non_finite(value):
            raise EncodeError("NaN and Infinity are not JSON numbers")
        return data
    try:
        text: str = _with_unlimited_digits(
            json.dumps, value, default=_default, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError, RecursionError) as exc:
        raise EncodeError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    return text.encode("ascii")


def _has_non_finite(value: Any, depth: int = 0) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if depth > 200:
        return False
    if isinstance(value, dict):
        return any(_has_non_finite(v, depth + 1) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_non_finite(v, depth + 1) for v in value)
    return False


def _with_unlimited_digits(func: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``func``, lifting Python's int/str digit limit if it refuses an integer.

    The limit (4,300 digits by default) is lifted for one retry, then restored.
    """
    try:
        return func(*args, **kwargs)
    except ValueError as exc:
        if "digits" not in str(exc):
            raise
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        return func(*args, **kwargs)
    finally:
        sys.set_int_max_str_digits(previous)


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def dumps_str(value: Any) -> str:
    """Like :func:`dumps`, returning ``str``."""
    return dumps(value).decode("utf-8")


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """Decode one JSON document.

    Args:
        data: UTF-8 bytes or text.

    Returns:
        The decoded value; integers beyond 64 bits come back exact (as ``int``).

    Raises:
        DecodeError: not valid JSON; the message names the line and column.
    """
    first_error: Exception | None = None
    pattern = _LONG_DIGITS_STR if isinstance(data, str) else _LONG_DIGITS_BYTES
    if pattern.search(data) is None:  # type: ignore[arg-type]
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            first_error = exc
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", "surrogatepass")
        return _with_unlimited_digits(json.loads, text, parse_constant=_no_constants)
    except RecursionError:
        raise DecodeError("the document is nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(_describe(exc, first_error)) from exc


def _describe(exc: Exception, fallback: Exception | None) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"
    return str(fallback or exc)
