"""Statistics tools: binomial probability, mean, standard deviation, regression, cosine."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.extensions.bfcl._common import (
    Integer,
    Number,
    arithmetic_guard,
    ensure_finite,
    refuse_beyond_float_range,
    sum_in_order,
)
from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = [
    "CalcBinomialProbability",
    "CalcBinomialProbabilityArguments",
    "CalculateCosineSimilarity",
    "CalculateCosineSimilarityArguments",
    "CalculateMean",
    "CalculateMeanArguments",
    "CalculateStandardDeviation",
    "CalculateStandardDeviationArguments",
    "LinearRegression",
    "LinearRegressionArguments",
]


class CalcBinomialProbabilityArguments(BaseModel):
    """Arguments of calc_binomial_probability."""

    model_config = ConfigDict(extra="forbid")

    n: Integer = Field(description="The number of trials.")
    k: Integer = Field(description="The number of successes.")
    p: Number = Field(description="The probability of success, from 0 to 1.")


class CalcBinomialProbability(Tool):
    """Calculate the probability of exactly k successes in n independent trials.

    Each trial succeeds with probability p (binomial distribution).
    """

    name = "calc_binomial_probability"
    arguments_model = CalcBinomialProbabilityArguments

    def call(self, arguments: CalcBinomialProbabilityArguments, context: ExtensionContext) -> float:
        """Return ``C(n, k) * (p**k * (1 - p)**(n - k))``."""
        n, k, p = arguments.n, arguments.k, arguments.p
        if not 0 <= k <= n:
            raise ExtensionToolError(f"k must satisfy 0 <= k <= n, got n={n}, k={k}")
        if not 0 <= p <= 1:
            raise ExtensionToolError(f"p must be between 0 and 1, got {p}")
        message = "n is too large: the binomial coefficient exceeds the float range"
        log_comb = math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
        refuse_beyond_float_range(log_comb / math.log(10), message)
        with arithmetic_guard(message):
            coefficient = float(math.comb(n, k))
            result = coefficient * ((p**k) * ((1 - p) ** (n - k)))
        return float(ensure_finite(result, message))


class CalculateMeanArguments(BaseModel):
    """Arguments of calculate_mean."""

    model_config = ConfigDict(extra="forbid")

    numbers: list[Number] = Field(description="The list of numbers.")


class CalculateMean(Tool):
    """Calculate the arithmetic mean of a non-empty list of numbers."""

    name = "calculate_mean"
    arguments_model = CalculateMeanArguments

    def call(self, arguments: CalculateMeanArguments, context: ExtensionContext) -> float:
        """Return the sum (in list order) divided by the count."""
        numbers = arguments.numbers
        if not numbers:
            raise ExtensionToolError("numbers must not be empty")
        message = "numbers are too large: the mean exceeds the float range"
        with arithmetic_guard(message):
            mean = sum_in_order(numbers) / len(numbers)
        return float(ensure_finite(mean, message))


class CalculateStandardDeviationArguments(BaseModel):
    """Arguments of calculate_standard_deviation."""

    model_config = ConfigDict(extra="forbid")

    numbers: list[Number] = Field(description="The list of numbers.")


class CalculateStandardDeviation(Tool):
    """Calculate the population standard deviation (dividing by N) of a list of numbers."""

    name = "calculate_standard_deviation"
    arguments_model = CalculateStandardDeviationArguments

    def call(
        self, arguments: CalculateStandardDeviationArguments, context: ExtensionContext
    ) -> float:
        """Return ``(sum((x - mean)**2) / N) ** 0.5``."""
        numbers = arguments.numbers
        if not numbers:
            raise ExtensionToolError("numbers must not be empty")
        message = "numbers are too large: the standard deviation exceeds the float range"
        count = len(numbers)
        with arithmetic_guard(message):
            mean = sum_in_order(numbers) / count
            variance = sum_in_order((value - mean) ** 2 for value in numbers) / count
            deviation = variance**0.5
        return float(ensure_finite(deviation, message))


class LinearRegressionArguments(BaseModel):
    """Arguments of linear_regression."""

    model_config = ConfigDict(extra="forbid")

    x: list[Integer] = Field(description="The x coordinates of the points.")
    y: list[Integer] = Field(description="The y coordinates of the points.")
    point: Integer = Field(description="The x value at which to evaluate the fitted line.")


class LinearRegression(Tool):
    """Fit a least-squares line y = slope * x + intercept and evaluate it at a point.

    x and y must have the same length (at least 2) and x must not be all equal.
    """

    name = "linear_regression"
    arguments_model = LinearRegressionArguments

    def call(self, arguments: LinearRegressionArguments, context: ExtensionContext) -> float:
        """Return ``slope * point + intercept`` of the ordinary least-squares fit."""
        xs, ys, point = arguments.x, arguments.y, arguments.point
        if len(xs) != len(ys):
            raise ExtensionToolError(
                f"x and y must have the same length, got {len(xs)} and {len(ys)}"
            )
        if len(xs) < 2:
            raise ExtensionToolError(f"x and y need at least 2 points, got {len(xs)}")
        if all(value == xs[0] for value in xs):
            raise ExtensionToolError("x must not have all values equal (the slope is undefined)")
        count = len(xs)
        message = "x and y are too large: the fit exceeds the float range"
        with arithmetic_guard(message):
            sum_x = sum_in_order(xs)
            sum_y = sum_in_order(ys)
            sum_xx = sum_in_order(value**2 for value in xs)
            sum_xy = sum_in_order(xs[i] * ys[i] for i in range(count))
            slope = ((count * sum_xy) - (sum_x * sum_y)) / ((count * sum_xx) - (sum_x**2))
            intercept = (sum_y - (slope * sum_x)) / count
            result = (slope * point) + intercept
        return float(ensure_finite(result, message))


class CalculateCosineSimilarityArguments(BaseModel):
    """Arguments of calculate_cosine_similarity."""

    model_config = ConfigDict(extra="forbid")

    vectorA: list[Number] = Field(description="The first vector.")
    vectorB: list[Number] = Field(description="The second vector, of the same length.")


class CalculateCosineSimilarity(Tool):
    """Calculate the cosine similarity of two non-zero vectors of the same length."""

    name = "calculate_cosine_similarity"
    arguments_model = CalculateCosineSimilarityArguments

    def call(
        self, arguments: CalculateCosineSimilarityArguments, context: ExtensionContext
    ) -> float:
        """Return ``dot(A, B) / (|A| * |B|)``."""
        vector_a, vector_b = arguments.vectorA, arguments.vectorB
        if not vector_a or not vector_b:
            raise ExtensionToolError("vectorA and vectorB must not be empty")
        if len(vector_a) != len(vector_b):
            raise ExtensionToolError(
                f"vectorA and vectorB must have the same length, "
                f"got {len(vector_a)} and {len(vector_b)}"
            )
        for label, vector in (("vectorA", vector_a), ("vectorB", vector_b)):
            if all(value == 0 for value in vector):
                raise ExtensionToolError(f"{label} must not be the zero vector")
        message = "the vectors' values are too large or too small for a float computation"
        with arithmetic_guard(message):
            dot = sum_in_order(vector_a[i] * vector_b[i] for i in range(len(vector_a)))
            norm_a = sum_in_order(value**2 for value in vector_a) ** 0.5
            norm_b = sum_in_order(value**2 for value in vector_b) ** 0.5
            result = dot / (norm_a * norm_b)
        return float(ensure_finite(result, message))
