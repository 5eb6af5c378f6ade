"""The ``bfcl`` extension: the 32 offline functions of BFCL's executable categories.

Our own implementation, with pydantic argument models, of the pure (no network)
functions that the Berkeley Function Calling Leaderboard (BFCL, Gorilla project,
UC Berkeley; Apache-2.0) calls in its ``exec_*`` categories. The tools keep the BFCL
names (``ext_bfcl_<name>`` on the wire) and return the values the reference returns
for in-domain arguments; arguments outside a function's domain give ``tool_error``.
"""

from __future__ import annotations

from toolfleet.extensions.bfcl.algebra import (
    EstimateDerivative,
    MatMul,
    QuadraticRoots,
    SortArray,
)
from toolfleet.extensions.bfcl.finance import (
    CalculateFutureValue,
    CalculateInvestmentValue,
    MortgageCalculator,
)
from toolfleet.extensions.bfcl.geometry import (
    CalculateTriangleArea,
    GeometryAreaCircle,
    GetDistance,
    MaxPoints,
    PolygonArea,
)
from toolfleet.extensions.bfcl.health import CalculateNutritionalNeeds
from toolfleet.extensions.bfcl.math_tools import (
    AddBinaryNumbers,
    CalculatePermutations,
    GetFibonacciNumber,
    GetFibonacciSequence,
    GetPrimeFactors,
    MathFactorial,
    MathGcd,
    MathLcm,
)
from toolfleet.extensions.bfcl.orders import BookRoom, OrderFood
from toolfleet.extensions.bfcl.physics import (
    CalculateDensity,
    CalculateDisplacement,
    CalculateElectrostaticPotentialEnergy,
    CalculateFinalVelocity,
)
from toolfleet.extensions.bfcl.stats import (
    CalcBinomialProbability,
    CalculateCosineSimilarity,
    CalculateMean,
    CalculateStandardDeviation,
    LinearRegression,
)
from toolfleet.shared import Extension, Tool
from toolfleet.shared.manifest import ToolOptions

__all__ = ["TOOLS", "extension"]

TOOLS: tuple[type[Tool], ...] = (
    AddBinaryNumbers,
    BookRoom,
    CalcBinomialProbability,
    CalculateCosineSimilarity,
    CalculateDensity,
    CalculateDisplacement,
    CalculateElectrostaticPotentialEnergy,
    CalculateFinalVelocity,
    CalculateFutureValue,
    CalculateInvestmentValue,
    CalculateMean,
    CalculateNutritionalNeeds,
    CalculatePermutations,
    CalculateStandardDeviation,
    CalculateTriangleArea,
    EstimateDerivative,
    GeometryAreaCircle,
    GetDistance,
    GetFibonacciNumber,
    GetFibonacciSequence,
    GetPrimeFactors,
    LinearRegression,
    MatMul,
    MathFactorial,
    MathGcd,
    MathLcm,
    MaxPoints,
    MortgageCalculator,
    OrderFood,
    PolygonArea,
    QuadraticRoots,
    SortArray,
)
"""All 32 tools, in the alphabetical order of their BFCL names."""

extension = Extension(
    slug="bfcl",
    version="1.0.0",
    description=(
        "The 32 offline functions of the Berkeley Function Calling Leaderboard's "
        "executable categories (math, statistics, geometry, physics, finance, orders)."
    ),
    tools=TOOLS,
    timeout_s=30.0,
    # Every function is pure (its result depends on its arguments alone, and it changes
    # nothing), so a call whose worker died is re-run instead of answered ``crashed``.
    tool_options={tool.name: ToolOptions(idempotent=True) for tool in TOOLS},
)
