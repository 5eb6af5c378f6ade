"""Integer arithmetic tools: binary addition, factorials, gcd/lcm, primes, Fibonacci."""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.extensions.bfcl._common import Integer, arithmetic_guard, refuse_beyond_float_range
from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = [
    "MAX_FACTORIAL",
    "MAX_FACTORIZED",
    "MAX_FIBONACCI_INDEX",
    "MAX_FIBONACCI_SEQUENCE",
    "AddBinaryNumbers",
    "AddBinaryNumbersArguments",
    "CalculatePermutations",
    "CalculatePermutationsArguments",
    "GetFibonacciNumber",
    "GetFibonacciNumberArguments",
    "GetFibonacciSequence",
    "GetFibonacciSequenceArguments",
    "GetPrimeFactors",
    "GetPrimeFactorsArguments",
    "MathFactorial",
    "MathFactorialArguments",
    "MathGcd",
    "MathGcdArguments",
    "MathLcm",
    "MathLcmArguments",
]

# Bounds that keep one call well under 0.1 s of CPU on a slow core (a thread tool holds
# the GIL, and with it every other call of its process, for as long as it computes):
MAX_FACTORIAL = 10_000
"""Largest ``n`` of ``math_factorial``: 10000! has 35,660 digits (about 20 ms)."""
MAX_FACTORIZED = 10**12
"""Largest ``number`` of ``get_prime_factors``: trial division to 10**6 (about 50 ms)."""
MAX_FIBONACCI_INDEX = 100_000
"""Largest ``n`` of ``get_fibonacci_number``: F(100000) has 20,899 digits (about 10 ms)."""
MAX_FIBONACCI_SEQUENCE = 2_000
"""Largest ``n`` of ``get_fibonacci_sequence``: 0.4 MB of digits, under the result limit."""
_LN10 = math.log(10)

_BINARY = re.compile(r"[01]+")


class AddBinaryNumbersArguments(BaseModel):
    """Arguments of add_binary_numbers."""

    model_config = ConfigDict(extra="forbid")

    a: str = Field(description="The first binary number, as a string of 0 and 1 digits.")
    b: str = Field(description="The second binary number, as a string of 0 and 1 digits.")


class AddBinaryNumbers(Tool):
    """Add two binary numbers given as strings of 0/1 digits.

    Returns the sum in base 2, without prefix or leading zeros (for example "0011" plus
    "1100" gives "1111").
    """

    name = "add_binary_numbers"
    arguments_model = AddBinaryNumbersArguments

    def call(self, arguments: AddBinaryNumbersArguments, context: ExtensionContext) -> str:
        """Return ``a + b`` written in base 2."""
        for label, digits in (("a", arguments.a), ("b", arguments.b)):
            if not _BINARY.fullmatch(digits):
                raise ExtensionToolError(
                    f"{label} must be a non-empty string of the digits 0 and 1, got {digits!r}"
                )
        return format(int(arguments.a, 2) + int(arguments.b, 2), "b")


class MathFactorialArguments(BaseModel):
    """Arguments of math_factorial."""

    model_config = ConfigDict(extra="forbid")

    n: Integer = Field(
        le=MAX_FACTORIAL, description="The number to calculate the factorial of (at most 10000)."
    )


class MathFactorial(Tool):
    """Calculate the factorial n! of a non-negative integer, exactly (0! = 1)."""

    name = "math_factorial"
    arguments_model = MathFactorialArguments

    def call(self, arguments: MathFactorialArguments, context: ExtensionContext) -> int:
        """Return ``n!`` as an exact integer."""
        if arguments.n < 0:
            raise ExtensionToolError(f"n must be >= 0, got {arguments.n}")
        return math.factorial(arguments.n)


class MathGcdArguments(BaseModel):
    """Arguments of math_gcd."""

    model_config = ConfigDict(extra="forbid")

    a: Integer = Field(description="The first number.")
    b: Integer = Field(description="The second number.")


class MathGcd(Tool):
    """Calculate the greatest common divisor of two integers (never negative)."""

    name = "math_gcd"
    arguments_model = MathGcdArguments

    def call(self, arguments: MathGcdArguments, context: ExtensionContext) -> int:
        """Return the non-negative gcd of ``a`` and ``b``."""
        return math.gcd(arguments.a, arguments.b)


class MathLcmArguments(BaseModel):
    """Arguments of math_lcm."""

    model_config = ConfigDict(extra="forbid")

    a: Integer = Field(description="The first number.")
    b: Integer = Field(description="The second number.")


class MathLcm(Tool):
    """Calculate the least common multiple of two integers, returned as a float."""

    name = "math_lcm"
    arguments_model = MathLcmArguments

    def call(self, arguments: MathLcmArguments, context: ExtensionContext) -> float:
        """Return ``|a * b| / gcd(a, b)`` (true division, so always a float)."""
        a, b = arguments.a, arguments.b
        if a == 0 and b == 0:
            raise ExtensionToolError("a and b must not both be 0")
        with arithmetic_guard("a and b are too large: their lcm exceeds the float range"):
            return abs(a * b) / math.gcd(a, b)


class GetPrimeFactorsArguments(BaseModel):
    """Arguments of get_prime_factors."""

    model_config = ConfigDict(extra="forbid")

    number: Integer = Field(
        le=MAX_FACTORIZED,
        description="The number to calculate the prime factors of (at most 10**12).",
    )


class GetPrimeFactors(Tool):
    """Calculate the prime factors of a positive integer, with multiplicity, ascending.

    For example 456 gives [2, 2, 2, 3, 19]; a prime gives itself; 1 gives [].
    """

    name = "get_prime_factors"
    arguments_model = GetPrimeFactorsArguments

    def call(self, arguments: GetPrimeFactorsArguments, context: ExtensionContext) -> list[int]:
        """Return the prime factorisation by exact trial division up to the square root."""
        remaining = arguments.number
        if remaining < 1:
            raise ExtensionToolError(f"number must be >= 1, got {remaining}")
        factors: list[int] = []
        while remaining % 2 == 0:
            factors.append(2)
            remaining //= 2
        divisor = 3
        while divisor * divisor <= remaining:
            while remaining % divisor == 0:
                factors.append(divisor)
                remaining //= divisor
            divisor += 2
        if remaining > 1:
            factors.append(remaining)
        return factors


def _fibonacci_pair(index: int) -> tuple[int, int]:
    """Return ``(G(index), G(index + 1))`` of the sequence G(0) = 0, G(1) = 1 (fast doubling)."""
    a, b = 0, 1
    for bit in format(index, "b"):
        # (a, b) = (G(m), G(m + 1)) -> (G(2m), G(2m + 1))
        a, b = a * (2 * b - a), a * a + b * b
        if bit == "1":
            a, b = b, a + b
    return a, b


class GetFibonacciNumberArguments(BaseModel):
    """Arguments of get_fibonacci_number."""

    model_config = ConfigDict(extra="forbid")

    n: Integer = Field(
        le=MAX_FIBONACCI_INDEX,
        description="The position (from 1) of the Fibonacci number to return; F(1) = 0 "
        "(at most 100000).",
    )


class GetFibonacciNumber(Tool):
    """Calculate the n-th Fibonacci number, counted from F(1) = 0, F(2) = 1.

    F(n) = F(n-1) + F(n-2), so n = 1..10 give 0, 1, 1, 2, 3, 5, 8, 13, 21, 34. Exact
    integers of any size.
    """

    name = "get_fibonacci_number"
    arguments_model = GetFibonacciNumberArguments

    def call(self, arguments: GetFibonacciNumberArguments, context: ExtensionContext) -> int:
        """Return F(n), which is element ``n - 1`` of ``get_fibonacci_sequence``."""
        n = arguments.n
        if n < 1:
            raise ExtensionToolError(f"n must be a positive integer (>= 1), got {n}")
        return _fibonacci_pair(n - 1)[0]


class GetFibonacciSequenceArguments(BaseModel):
    """Arguments of get_fibonacci_sequence."""

    model_config = ConfigDict(extra="forbid")

    n: Integer = Field(
        le=MAX_FIBONACCI_SEQUENCE,
        description="The number of Fibonacci numbers to calculate (at most 2000).",
    )


class GetFibonacciSequence(Tool):
    """Calculate the first n Fibonacci numbers, starting 0, 1, 1, 2, 3, ...

    Returns a list of n exact integers (n = 1 gives [0]).
    """

    name = "get_fibonacci_sequence"
    arguments_model = GetFibonacciSequenceArguments

    def call(
        self, arguments: GetFibonacciSequenceArguments, context: ExtensionContext
    ) -> list[int]:
        """Return the list of the first ``n`` Fibonacci numbers."""
        n = arguments.n
        if n < 1:
            raise ExtensionToolError(f"n must be a positive integer (>= 1), got {n}")
        sequence = [0, 1][:n]
        while len(sequence) < n:
            sequence.append(sequence[-2] + sequence[-1])
        return sequence


class CalculatePermutationsArguments(BaseModel):
    """Arguments of calculate_permutations."""

    model_config = ConfigDict(extra="forbid")

    n: Integer = Field(description="The number of elements in the set.")
    k: Integer = Field(description="The number of elements to choose.")


class CalculatePermutations(Tool):
    """Calculate the number of ordered selections of k elements out of n, n!/(n-k)!.

    The count is returned as a float.
    """

    name = "calculate_permutations"
    arguments_model = CalculatePermutationsArguments

    def call(self, arguments: CalculatePermutationsArguments, context: ExtensionContext) -> float:
        """Return ``n! / (n - k)!`` rounded once to a float."""
        n, k = arguments.n, arguments.k
        if not 0 <= k <= n:
            raise ExtensionToolError(f"k must satisfy 0 <= k <= n, got n={n}, k={k}")
        message = "n and k are too large: the count exceeds the float range"
        refuse_beyond_float_range((math.lgamma(n + 1) - math.lgamma(n - k + 1)) / _LN10, message)
        count = math.perm(n, k)
        with arithmetic_guard("n and k are too large: the count exceeds the float range"):
            return float(count)
