"""Algebra tools: quadratic roots, matrix product, sorting, numerical derivative."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolfleet.extensions.bfcl._common import (
    Integer,
    Number,
    arithmetic_guard,
    ensure_finite,
    sum_in_order,
)
from toolfleet.extensions.bfcl._expression import EvaluationError, parse_lambda
from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = [
    "DERIVATIVE_STEP",
    "EstimateDerivative",
    "EstimateDerivativeArguments",
    "MatMul",
    "MatMulArguments",
    "QuadraticRoots",
    "QuadraticRootsArguments",
    "SortArray",
    "SortArrayArguments",
]

DERIVATIVE_STEP = 1e-10
"""The forward-difference step ``h`` of ``estimate_derivative``."""


class QuadraticRootsArguments(BaseModel):
    """Arguments of quadratic_roots."""

    model_config = ConfigDict(extra="forbid")

    a: Integer = Field(description="The first coefficient (of x squared); must not be 0.")
    b: Integer = Field(description="The second coefficient (of x).")
    c: Integer = Field(description="The third coefficient (the constant term).")


class QuadraticRoots(Tool):
    """Calculate the roots of the quadratic equation a*x**2 + b*x + c = 0.

    Returns two floats, the "+" root first, when the discriminant is >= 0; otherwise two
    objects {"real": ..., "imaginary": ...}, the complex conjugate roots.
    """

    name = "quadratic_roots"
    arguments_model = QuadraticRootsArguments

    def call(self, arguments: QuadraticRootsArguments, context: ExtensionContext) -> list[Any]:
        """Return ``[r1, r2]`` as floats or as real/imaginary objects."""
        a, b, c = arguments.a, arguments.b, arguments.c
        if a == 0:
            raise ExtensionToolError("a must not be 0 (the equation would not be quadratic)")
        with arithmetic_guard("a, b and c are too large: the roots exceed the float range"):
            discriminant = (b**2) - ((4 * a) * c)
            if discriminant >= 0:
                root = discriminant**0.5
                roots: list[Any] = [((-b) + root) / (2 * a), ((-b) - root) / (2 * a)]
            else:
                real = (-b) / (2 * a)
                imaginary = (abs(discriminant) ** 0.5) / (2 * a)
                roots = [
                    {"real": real, "imaginary": imaginary},
                    {"real": real, "imaginary": -imaginary},
                ]
        return ensure_finite(roots, "a, b and c are too large: the roots exceed the float range")


class MatMulArguments(BaseModel):
    """Arguments of mat_mul."""

    model_config = ConfigDict(extra="forbid")

    matA: list[list[Integer]] = Field(description="The first matrix, as a list of rows.")
    matB: list[list[Integer]] = Field(description="The second matrix, as a list of rows.")


def _matrix_shape(label: str, matrix: list[list[int]]) -> tuple[int, int]:
    """Return ``(rows, columns)`` of a non-empty rectangular matrix, or raise."""
    if not matrix or not matrix[0]:
        raise ExtensionToolError(f"{label} must be a non-empty matrix with non-empty rows")
    columns = len(matrix[0])
    for index, row in enumerate(matrix):
        if len(row) != columns:
            raise ExtensionToolError(
                f"{label} must be rectangular: row {index} has {len(row)} entries, "
                f"row 0 has {columns}"
            )
    return len(matrix), columns


class MatMul(Tool):
    """Multiply two integer matrices (lists of rows): returns matA x matB.

    The number of columns of matA must equal the number of rows of matB.
    """

    name = "mat_mul"
    arguments_model = MatMulArguments

    def call(self, arguments: MatMulArguments, context: ExtensionContext) -> list[list[int]]:
        """Return the exact matrix product."""
        mat_a, mat_b = arguments.matA, arguments.matB
        rows, inner = _matrix_shape("matA", mat_a)
        inner_b, columns = _matrix_shape("matB", mat_b)
        if inner != inner_b:
            raise ExtensionToolError(
                f"matA has {inner} columns but matB has {inner_b} rows; they must be equal"
            )
        return [
            [
                int(sum_in_order(mat_a[i][k] * mat_b[k][j] for k in range(inner)))
                for j in range(columns)
            ]
            for i in range(rows)
        ]


class SortArrayArguments(BaseModel):
    """Arguments of sort_array."""

    model_config = ConfigDict(extra="forbid")

    array: list[Number] = Field(description="The array of numbers.")
    reverse: bool = Field(
        default=False,
        description="Whether to sort the array in reverse order, i.e., descending order.",
    )


class SortArray(Tool):
    """Sort an array of numbers, ascending (or descending when reverse is true).

    The sort is stable and the numbers are returned unchanged.
    """

    name = "sort_array"
    arguments_model = SortArrayArguments

    def call(self, arguments: SortArrayArguments, context: ExtensionContext) -> list[int | float]:
        """Return a sorted copy of ``array``."""
        return sorted(arguments.array, reverse=arguments.reverse)


class EstimateDerivativeArguments(BaseModel):
    """Arguments of estimate_derivative."""

    model_config = ConfigDict(extra="forbid")

    function: str = Field(
        description=(
            "The function to differentiate, as the source of a one-argument Python lambda "
            "using only its parameter, numbers, + - * / ** and parentheses, "
            "e.g. 'lambda x: 3*x**2 + 2*x + 1'."
        )
    )
    x: Integer = Field(description="The point to calculate the derivative at.")

    @field_validator("function")
    @classmethod
    def _in_language(cls, value: str) -> str:
        """Accept only the arithmetic-lambda language (never evaluated as code)."""
        parse_lambda(value)
        return value


class EstimateDerivative(Tool):
    """Estimate the derivative of a function at a point with a forward difference.

    The function is a Python lambda source such as 'lambda x: 3*x**2 + 2*x + 1'; the
    result is (f(x + h) - f(x)) / h with h = 1e-10, so it carries rounding noise
    (32.00000264769187 for that example at x = 5).
    """

    name = "estimate_derivative"
    arguments_model = EstimateDerivativeArguments

    def call(self, arguments: EstimateDerivativeArguments, context: ExtensionContext) -> float:
        """Return ``(f(x + h) - f(x)) / h``."""
        function = parse_lambda(arguments.function)
        x = arguments.x
        message = f"function cannot be evaluated near x={x}"
        try:
            with arithmetic_guard(f"{message}: overflow", f"{message}: division by zero"):
                shifted = x + DERIVATIVE_STEP
                after = function(shifted)
                before = function(x)
                result = (after - before) / DERIVATIVE_STEP
        except EvaluationError as exc:
            raise ExtensionToolError(f"{message}: {exc}") from exc
        return float(ensure_finite(result, f"{message}: the result is not finite"))
