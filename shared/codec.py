"""JSON encoding for everything on the wire (orjson, exact).

orjson refuses integers beyond 64 bits and strings holding lone surrogates; for
such a payload the standard library encodes it instead, so ``factorial(30)`` still
travels as a JSON number and odd text never crashes an encoder. Decoding uses
orjson and falls back to the standard library for the same cases.

An integer with more digits than Python's int/str conversion limit
(``sys.get_int_max_str_digits()``, 4,300 by default; ``factorial(1700)`` has 4,756) is
decoded as a :class:`BigInt`: an ``int`` equal to it whose ``str``/``repr`` give every
digit, so ``print(result.content)`` works for it as for any result, while the limit (a
process-wide guard of the host application) stays as it is. :func:`dumps` re-encodes it
exactly; ``json.dumps`` of such a number needs the limit raised, as for any ``int``.

Both directions accept exactly the documents nested at most
:data:`~toolfleet.shared.limits.MAX_DEPTH` (1,024) levels deep, the depth orjson's decoder
accepts: orjson's encoder stops at 255 levels and the standard library at Python's
recursion limit (about 1,000 levels, less inside a deep call stack, more where the host
application raised it), so the codec counts the depth itself on the fallback path and
gives the standard library the stack it needs to reach the bound.
"""

from __future__ import annotations

import contextlib
import decimal
import json
import math
import re
import sys
import threading
from collections.abc import Iterator
from typing import Any

import orjson

from toolfleet.shared.limits import MAX_DEPTH

__all__ = ["BigInt", "DecodeError", "EncodeError", "depth_exceeds", "dumps", "dumps_str", "loads"]

# orjson decodes integers beyond 64 bits as floats (losing digits); a run of 19 or more
# digits that is not a fraction sends the document to the standard library, which keeps
# them exact (the fraction digits of a float like 0.00028014183044433594 do not).
_LONG_DIGITS_STR = re.compile(r"(?<![.\d])\d{19}")
# the same test on bytes, without the regular expression (which tries its look-behind
# at every byte): each byte mapped to its class (ASCII digit "0", "." itself, anything
# else " "), a long run is " " followed by 19 "0"s (the document is given a " " first)
_BYTE_CLASSES = bytes(48 if 48 <= byte <= 57 else 46 if byte == 46 else 32 for byte in range(256))
_LONG_RUN = b" " + b"0" * 19


class BigInt(int):
    """An ``int`` decoded with more digits than Python's int/str limit; it prints whole.

    ``str``, ``repr`` and ``format(x)`` give its exact decimal digits through
    :mod:`decimal` (which that limit does not apply to), without touching
    ``sys.set_int_max_str_digits``. Arithmetic on it gives plain ``int`` s; a format spec
    (``f"{x:,}"``) formats as ``int`` does.
    """

    __slots__ = ()

    def __str__(self) -> str:
        return str(decimal.Decimal(int(self)))

    __repr__ = __str__

    def __format__(self, spec: str) -> str:
        return str(self) if not spec else int.__format__(self, spec)


def _parse_int(text: str) -> int:
    """A JSON integer: an ``int``, or a :class:`BigInt` past Python's digit limit."""
    limit = sys.get_int_max_str_digits()
    if not limit or len(text) - text.startswith("-") <= limit:
        return int(text)
    return BigInt(decimal.Decimal(text))


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


def dumps(value: Any, *, max_depth: int = MAX_DEPTH) -> bytes:
    r"""Encode ``value`` as compact UTF-8 JSON.

    Args:
        value: any JSON value; pydantic models and tuples/sets are converted.
        max_depth: the deepest nesting of arrays and objects accepted (``{"a": 1}`` is 1);
            a part of a larger document passes what is left of
            :data:`~toolfleet.shared.limits.MAX_DEPTH` for it.

    Returns:
        The JSON document as bytes. Integers of any size are written with every digit;
        lone surrogates are written as ``\\udXXX`` escapes.

    Raises:
        EncodeError: the value holds something that is not JSON, NaN or Infinity (JSON
            has no such numbers), or nests deeper than ``max_depth``.
    """
    try:
        data = orjson.dumps(value, default=_default)
    except (orjson.JSONEncodeError, TypeError):
        pass
    else:
        # orjson writes NaN and Infinity as null; refuse them instead of changing the value
        if b"null" in data and _has_non_finite(value):
            raise EncodeError("NaN and Infinity are not JSON numbers")
        # orjson encodes at most 254 levels: only a tighter bound needs counting
        if max_depth < _ORJSON_ENCODE_DEPTH and _brackets(data) > max_depth:
            _check_depth(value, max_depth)
        return data
    # the fallback (deep, big integers, lone surrogates): counted before the standard
    # library recurses into it
    _check_depth(value, max_depth)
    try:
        text: str = _with_unlimited_digits(
            _deep_enough, json.dumps, value, default=_default, separators=(",", ":"),
            allow_nan=False,
        )  # fmt: skip
    except _TooDeep:
        raise EncodeError(_too_deep(max_depth)) from None
    except (TypeError, ValueError, RecursionError) as exc:
        raise EncodeError(f"{type(exc).__name__}: {str(exc)[:200]}") from None
    return text.encode("ascii")


#: Levels of nesting orjson's encoder handles (it refuses a 255th).
_ORJSON_ENCODE_DEPTH = 254


class _TooDeep(Exception):
    """The standard library ran out of stack even with room for ``MAX_DEPTH`` levels."""


def _too_deep(max_depth: int) -> str:
    return f"the document nests deeper than {max_depth} levels of arrays and objects"


def _brackets(data: bytes | bytearray | memoryview | str) -> int:
    """An upper bound of the depth of a JSON text: its opening brackets (C speed)."""
    if isinstance(data, str):
        return data.count("{") + data.count("[")
    raw = bytes(data) if isinstance(data, memoryview) else data
    return raw.count(b"{") + raw.count(b"[")


def _check_depth(value: Any, max_depth: int) -> None:
    if depth_exceeds(value, max_depth):
        raise EncodeError(_too_deep(max_depth))


def depth_exceeds(value: Any, max_depth: int) -> bool:
    """True when ``value`` nests deeper than ``max_depth`` levels of arrays and objects.

    Counted without recursion (any depth, cycles included), stopping at the first
    container past the bound; ``{"a": [1]}`` is depth 2, a scalar depth 0. Pydantic models
    count as the objects they dump to.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, (list, tuple, set, frozenset)):
            children = item
        elif callable(getattr(item, "model_dump", None)) and not isinstance(item, type):
            stack.append((item.model_dump(mode="json"), depth))
            continue
        else:
            continue
        if depth > max_depth:
            return True
        stack.extend((child, depth + 1) for child in children if not _scalar(child))
    return False


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


_headroom_lock = threading.Lock()
_headroom_users = 0
_headroom_restore = 0


@contextlib.contextmanager
def _headroom() -> Iterator[None]:
    """Raise Python's recursion limit by enough for ``MAX_DEPTH`` levels of C recursion.

    The standard library's JSON code recurses once or twice per level and counts against
    the recursion limit (Python 3.11 counts C and Python frames together). The limit is
    process-wide: it is raised while any thread is inside, restored when the last leaves.
    """
    global _headroom_users, _headroom_restore
    with _headroom_lock:
        if _headroom_users == 0:
            _headroom_restore = sys.getrecursionlimit()
            sys.setrecursionlimit(_headroom_restore + 3 * MAX_DEPTH)
        _headroom_users += 1
    try:
        yield
    finally:
        with _headroom_lock:
            _headroom_users -= 1
            if _headroom_users == 0:
                sys.setrecursionlimit(_headroom_restore)


def _deep_enough(func: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``func``; when it runs out of stack, once more with room for ``MAX_DEPTH`` levels.

    Raises:
        _TooDeep: it ran out of stack again (the document nests far deeper than the bound).
    """
    try:
        return func(*args, **kwargs)
    except RecursionError:
        pass
    with _headroom():
        try:
            return func(*args, **kwargs)
        except RecursionError:
            raise _TooDeep from None


#: Types whose values never hold a float (skipped without a call).
_NO_FLOATS = (str, int, bool, type(None))


def _has_non_finite(value: Any, depth: int = 0) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if depth > 200:
        return False
    if isinstance(value, dict):
        children: Any = value.values()
    elif isinstance(value, (list, tuple)):
        children = value
    else:
        return False
    for child in children:
        kind = type(child)
        if kind in _NO_FLOATS:
            continue
        if kind is float:
            if not math.isfinite(child):
                return True
        elif _has_non_finite(child, depth + 1):
            return True
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
        The decoded value; integers beyond 64 bits come back exact (as ``int``; past
        Python's int/str digit limit as :class:`BigInt`).

    Raises:
        DecodeError: not valid JSON (the message names the line and column), or nested
            deeper than :data:`~toolfleet.shared.limits.MAX_DEPTH` levels.
    """
    first_error: Exception | None = None
    exact = not _long_digits(data)
    # orjson's verdict on depth (its bound is MAX_DEPTH) also spares the standard library
    # a document too deep for it
    if exact or _brackets(data) > MAX_DEPTH:
        try:
            value = orjson.loads(data)
        except orjson.JSONDecodeError as exc:
            if str(exc).startswith("depth limit exceeded"):
                raise DecodeError(_too_deep(MAX_DEPTH)) from None
            first_error = exc
        else:
            if exact:
                return value
    try:
        text = data if isinstance(data, str) else bytes(data).decode("utf-8", "surrogatepass")
        value = _deep_enough(json.loads, text, parse_int=_parse_int, parse_constant=_no_constants)
    except _TooDeep:
        raise DecodeError(_too_deep(MAX_DEPTH)) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise DecodeError(_describe(exc, first_error)) from exc
    if _brackets(text) > MAX_DEPTH and depth_exceeds(value, MAX_DEPTH):
        raise DecodeError(_too_deep(MAX_DEPTH))
    return value


def _long_digits(data: bytes | bytearray | memoryview | str) -> bool:
    """Whether ``data`` holds 19 or more digits in a row not after a ``.``.

    Such a run is a number orjson would not decode exactly (or a string that merely
    looks like one): the standard library decodes that document.
    """
    if isinstance(data, str):
        return _LONG_DIGITS_STR.search(data) is not None
    return _LONG_RUN in (b" " + data).translate(_BYTE_CLASSES)


def _describe(exc: Exception, fallback: Exception | None) -> str:
    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"
    return str(fallback or exc)
