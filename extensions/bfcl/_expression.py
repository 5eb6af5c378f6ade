"""A safe reader and evaluator for one-argument arithmetic lambdas.

``estimate_derivative`` receives the source text of a Python lambda such as
``"lambda x: 3*x**2 + 2*x + 1"``. It is never handed to ``eval``: this module reads
exactly this language (FUNCTIONS.md, ``estimate_derivative``)::

    lambda NAME : EXPR
    EXPR   := TERM (('+' | '-') TERM)*
    TERM   := FACTOR (('*' | '/') FACTOR)*
    FACTOR := ('+' | '-') FACTOR | POWER
    POWER  := ATOM ['**' FACTOR]
    ATOM   := NAME | NUMBER | '(' EXPR ')'

which gives Python's precedence: ``**`` binds tightest and groups to the right,
``-x**2`` is ``-(x**2)`` and ``2**-x`` is ``2**(-x)``. Evaluation uses Python's own
operators on exact integers and binary64 floats, so it reproduces what the reference
computed with ``eval``.
"""

from __future__ import annotations

import keyword
import math
import re
from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "EvaluationError",
    "Lambda",
    "MAX_DEPTH",
    "MAX_INT_BITS",
    "MAX_SOURCE_LENGTH",
    "parse_lambda",
]

MAX_SOURCE_LENGTH = 4096
"""Longest accepted source text, in characters."""

MAX_DEPTH = 50
"""Deepest accepted nesting of parentheses, signs and powers."""

MAX_INT_BITS = 1 << 20
"""Largest exact integer an evaluation may build, in bits (guards ``10**10**10``)."""

Value: TypeAlias = int | float

_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\f\r\n]+)
    | (?P<number>(?:[0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)(?:[eE][+-]?[0-9]+)?)
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    | (?P<op>\*\*|[-+*/():])
    """,
    re.VERBOSE,
)
_INTEGER_LITERAL = re.compile(r"[0-9]+")
_IDENTIFIER_CHAR = re.compile(r"[A-Za-z0-9_.]")


class EvaluationError(ArithmeticError):
    """The expression is well formed but cannot be evaluated at this point."""


@dataclass(frozen=True)
class _Number:
    value: Value


@dataclass(frozen=True)
class _Variable:
    pass


@dataclass(frozen=True)
class _Sign:
    negative: bool
    operand: _Node


@dataclass(frozen=True)
class _Power:
    base: _Node
    exponent: _Node


@dataclass(frozen=True)
class _Chain:
    """A left-to-right chain of ``+ -`` or ``* /`` operations (kept flat, not nested)."""

    first: _Node
    rest: tuple[tuple[str, _Node], ...]


_Node: TypeAlias = _Number | _Variable | _Sign | _Power | _Chain


def _tokenize(source: str) -> list[tuple[str, str]]:
    """Split ``source`` into ``(kind, text)`` tokens, dropping whitespace.

    Raises:
        ValueError: on a character or literal outside the language.
    """
    tokens: list[tuple[str, str]] = []
    position = 0
    while position < len(source):
        match = _TOKEN.match(source, position)
        if match is None:
            raise ValueError(f"unexpected character {source[position]!r} at offset {position}")
        kind = match.lastgroup or ""
        text = match.group()
        position = match.end()
        if kind == "space":
            continue
        if kind == "number":
            if position < len(source) and _IDENTIFIER_CHAR.match(source, position):
                raise ValueError(f"invalid numeric literal near offset {match.start()}")
            if _INTEGER_LITERAL.fullmatch(text) and text[0] == "0" and text.strip("0"):
                raise ValueError(f"leading zeros are not allowed in integer {text!r}")
        tokens.append((kind, text))
    return tokens


class _Parser:
    """Recursive-descent parser over the token list of one lambda."""

    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self.tokens = tokens
        self.index = 0
        self.parameter = ""
        self.depth = 0

    def peek(self) -> tuple[str, str] | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            raise ValueError("unexpected end of the expression")
        self.index += 1
        return token

    def expect(self, text: str) -> None:
        kind, got = self.take()
        if got != text or kind == "number":
            raise ValueError(f"expected {text!r}, got {got!r}")

    def at_op(self, *ops: str) -> str | None:
        token = self.peek()
        if token is not None and token[0] == "op" and token[1] in ops:
            return token[1]
        return None

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise ValueError(f"the expression is nested more than {MAX_DEPTH} levels deep")

    def lambda_(self) -> _Node:
        self.expect("lambda")
        kind, name = self.take()
        if kind != "name" or keyword.iskeyword(name):
            raise ValueError(f"expected the lambda's parameter name, got {name!r}")
        self.parameter = name
        self.expect(":")
        body = self.expression()
        token = self.peek()
        if token is not None:
            raise ValueError(f"unexpected {token[1]!r} after the expression")
        return body

    def chain(self, ops: tuple[str, ...], operand: _Node, parse_next: str) -> _Node:
        rest: list[tuple[str, _Node]] = []
        while (op := self.at_op(*ops)) is not None:
            self.take()
            rest.append((op, getattr(self, parse_next)()))
        return _Chain(operand, tuple(rest)) if rest else operand

    def expression(self) -> _Node:
        return self.chain(("+", "-"), self.term(), "term")

    def term(self) -> _Node:
        return self.chain(("*", "/"), self.factor(), "factor")

    def factor(self) -> _Node:
        sign = self.at_op("+", "-")
        if sign is None:
            return self.power()
        self.take()
        self.enter()
        operand = self.factor()
        self.depth -= 1
        return _Sign(sign == "-", operand)

    def power(self) -> _Node:
        base = self.atom()
        if self.at_op("**") is None:
            return base
        self.take()
        self.enter()
        exponent = self.factor()
        self.depth -= 1
        return _Power(base, exponent)

    def atom(self) -> _Node:
        kind, text = self.take()
        if kind == "number":
            return _Number(int(text) if _INTEGER_LITERAL.fullmatch(text) else float(text))
        if kind == "name":
            if text != self.parameter:
                raise ValueError(f"unknown name {text!r}: only {self.parameter!r} may be used")
            return _Variable()
        if text == "(":
            self.enter()
            inner = self.expression()
            self.depth -= 1
            self.expect(")")
            return inner
        raise ValueError(f"unexpected {text!r}")


def _checked(value: object) -> Value:
    """Refuse results that leave the real, finite, bounded world."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EvaluationError("overflow: an intermediate value is not finite")
        return value
    if isinstance(value, int):
        if value.bit_length() > MAX_INT_BITS:
            raise EvaluationError("an intermediate integer is too large")
        return value
    # A negative base with a fractional exponent gives a complex number in Python.
    raise EvaluationError("the result is not a real number")


def _power(base: Value, exponent: Value) -> Value:
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and exponent * (abs(base).bit_length() - 1) > MAX_INT_BITS
    ):
        raise EvaluationError("an intermediate integer is too large")
    return _checked(base**exponent)


def _evaluate(node: _Node, x: Value) -> Value:
    if isinstance(node, _Number):
        return _checked(node.value)
    if isinstance(node, _Variable):
        return x
    if isinstance(node, _Sign):
        operand = _evaluate(node.operand, x)
        return -operand if node.negative else +operand
    if isinstance(node, _Power):
        return _power(_evaluate(node.base, x), _evaluate(node.exponent, x))
    value = _evaluate(node.first, x)
    for op, operand_node in node.rest:
        operand = _evaluate(operand_node, x)
        if op == "+":
            value = value + operand
        elif op == "-":
            value = value - operand
        elif op == "*":
            if (
                isinstance(value, int)
                and isinstance(operand, int)
                and value.bit_length() + operand.bit_length() > MAX_INT_BITS + 1
            ):
                raise EvaluationError("an intermediate integer is too large")
            value = value * operand
        else:
            value = value / operand
        value = _checked(value)
    return value


@dataclass(frozen=True)
class Lambda:
    """A parsed one-argument lambda; call it with an ``int`` or a ``float``.

    Attributes:
        parameter: the parameter's name.
        source: the source text it was read from.
    """

    parameter: str
    source: str
    _body: _Node

    def __call__(self, x: Value) -> Value:
        """Evaluate the body at ``x`` with Python's arithmetic.

        Raises:
            EvaluationError: on division by zero, ``0`` to a negative power, overflow,
                a non-finite or non-real value, or an integer beyond ``MAX_INT_BITS``.
        """
        try:
            return _evaluate(self._body, x)
        except EvaluationError:
            raise
        except (ZeroDivisionError, OverflowError) as exc:
            raise EvaluationError(str(exc) or type(exc).__name__) from exc


def parse_lambda(source: str) -> Lambda:
    """Read ``source`` as ``lambda NAME: EXPR`` in the language of this module.

    Args:
        source: the lambda's source text.

    Returns:
        The parsed :class:`Lambda`.

    Raises:
        ValueError: with the reason, when ``source`` is outside the language.
    """
    if len(source) > MAX_SOURCE_LENGTH:
        raise ValueError(f"the function is longer than {MAX_SOURCE_LENGTH} characters")
    parser = _Parser(_tokenize(source))
    body = parser.lambda_()
    return Lambda(parser.parameter, source, body)
