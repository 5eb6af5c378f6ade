"""BFCL function names to OpenAI function names, and back.

OpenAI function names must match ``^[a-zA-Z0-9_-]{1,64}$`` (Chat Completions
``tools[].function.name``). BFCL names break it in one way only: dots
(``math.factorial``, ``board_game.chess.get_top_players``, ``requests.get``).
Upstream BFCL replaces ``.`` with ``_`` for OpenAI-style providers; so do we, and
every other character outside the pattern as well.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator

from toolfleet.shared.naming import FUNCTION_NAME_RE, MAX_FUNCTION_NAME
from toolfleet.shared.schema.errors import SchemaError

__all__ = ["FunctionNameMap", "sanitize_function_name"]

_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_-]")
_HASH_LEN = 8


def _digest(name: str) -> str:
    return hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_LEN]


def _with_suffix(stem: str, suffix: str) -> str:
    """``stem_suffix``, cutting ``stem`` so the whole stays within 64 characters."""
    return f"{stem[: MAX_FUNCTION_NAME - len(suffix) - 1]}_{suffix}"


def sanitize_function_name(name: str) -> str:
    """Turn a BFCL function name into a valid OpenAI function name.

    Rule (OpenAI function names: ``^[a-zA-Z0-9_-]{1,64}$``): every character outside
    ``[a-zA-Z0-9_-]`` becomes ``_`` (``math.factorial`` → ``math_factorial``, as upstream
    BFCL does for OpenAI-style providers); a valid name is returned unchanged. A result
    longer than 64 characters is cut to 55 and ``_`` plus 8 hex digits of the SHA-256 of
    the original name are appended, so it stays deterministic and distinct.

    The rule is not injective (``a.b_c`` and ``a_b.c`` both give ``a_b_c``): use
    :class:`FunctionNameMap` to name a tool list and map returned names back.

    Args:
        name: the function name as declared, e.g. ``"board_game.chess.get_top_players"``.

    Returns:
        A name matching ``^[a-zA-Z0-9_-]{1,64}$``.

    Raises:
        SchemaError: ``name`` is not a non-empty string.
    """
    if not isinstance(name, str) or not name:
        raise SchemaError(f"function name must be a non-empty string, got {name!r}")
    cleaned = _NOT_ALLOWED.sub("_", name)
    if len(cleaned) <= MAX_FUNCTION_NAME:
        return cleaned
    return _with_suffix(cleaned, _digest(name))


class FunctionNameMap:
    """A two-way map between declared function names and unique OpenAI names.

    Use one map per tool list sent to a model (or per catalog). :meth:`add` gives each
    declared name its :func:`sanitize_function_name`; when that name is already taken by
    a *different* declared name (``a.b_c`` vs ``a_b.c``), the later one gets ``_`` plus
    8 hex digits of the SHA-256 of its declared name appended (cut to 64 characters).

    Names passed to the constructor are added valid-ones-first, so a name that is
    already valid keeps itself and the dotted twin gets the suffix, whatever the order
    (BFCL has two such pairs: ``car_rental``/``car.rental`` and
    ``solve_quadratic_equation``/``solve.quadratic_equation``).

    Example::

        names = FunctionNameMap(["math.factorial", "math_factorial"])
        names.openai_name("math_factorial")   # "math_factorial"
        names.openai_name("math.factorial")   # "math_factorial_<8 hex>"
        names.original("math_factorial")      # "math_factorial"

    Args:
        names: declared names to add now.
    """

    def __init__(self, names: Iterable[str] = ()) -> None:
        self._to_openai: dict[str, str] = {}
        self._to_original: dict[str, str] = {}
        pending = list(names)
        for name in pending:
            if isinstance(name, str) and FUNCTION_NAME_RE.match(name):
                self.add(name)
        for name in pending:
            self.add(name)

    def add(self, name: str) -> str:
        """Register a declared name (idempotent) and return its unique OpenAI name.

        Args:
            name: the declared function name.

        Returns:
            The OpenAI name, matching ``^[a-zA-Z0-9_-]{1,64}$``, unique in this map.
        """
        known = self._to_openai.get(name)
        if known is not None:
            return known
        candidate = sanitize_function_name(name)
        if candidate in self._to_original:
            candidate = _with_suffix(candidate, _digest(name))
            counter = 2
            while candidate in self._to_original:  # a hash collision: vanishingly rare
                candidate = _with_suffix(candidate, str(counter))
                counter += 1
        assert FUNCTION_NAME_RE.match(candidate), candidate
        self._to_openai[name] = candidate
        self._to_original[candidate] = name
        return candidate

    def openai_name(self, name: str) -> str:
        """The OpenAI name given to a declared name.

        Raises:
            KeyError: ``name`` was never added.
        """
        return self._to_openai[name]

    def original(self, openai_name: str) -> str:
        """The declared name behind an OpenAI name (e.g. one a model returned).

        Raises:
            KeyError: no declared name maps to ``openai_name``.
        """
        return self._to_original[openai_name]

    def __contains__(self, name: object) -> bool:
        return name in self._to_openai

    def __len__(self) -> int:
        return len(self._to_openai)

    def __iter__(self) -> Iterator[str]:
        return iter(self._to_openai)

    def items(self) -> list[tuple[str, str]]:
        """``(declared name, OpenAI name)`` pairs in the order they were added."""
        return list(self._to_openai.items())
