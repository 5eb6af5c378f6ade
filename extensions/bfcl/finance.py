"""Finance tools: future value, investment growth with inflation, mortgage payment."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.extensions.bfcl._common import Integer, Number, arithmetic_guard, ensure_finite
from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = [
    "MAX_EXACT_BITS",
    "CalculateFutureValue",
    "CalculateFutureValueArguments",
    "CalculateInvestmentValue",
    "CalculateInvestmentValueArguments",
    "MortgageCalculator",
    "MortgageCalculatorArguments",
]

MAX_EXACT_BITS = 1 << 20
"""Largest exact integer power ``calculate_future_value`` builds, in bits."""


class CalculateFutureValueArguments(BaseModel):
    """Arguments of calculate_future_value."""

    model_config = ConfigDict(extra="forbid")

    present_value: Number = Field(description="The present value of the investment, in dollars.")
    interest_rate: Number = Field(
        description="The interest rate per period, as a fraction (0.05 = 5%)."
    )
    periods: Integer = Field(description="The number of periods, in years.")


class CalculateFutureValue(Tool):
    """Calculate the future value of an investment with compound interest.

    Future value = present_value * (1 + interest_rate) ** periods.
    """

    name = "calculate_future_value"
    arguments_model = CalculateFutureValueArguments

    def call(
        self, arguments: CalculateFutureValueArguments, context: ExtensionContext
    ) -> int | float:
        """Return ``present_value * ((1 + interest_rate) ** periods)``."""
        present, periods = arguments.present_value, arguments.periods
        growth = 1 + arguments.interest_rate
        message = "interest_rate and periods give a growth factor beyond the float range"
        if (
            isinstance(growth, int)
            and periods > 0
            and abs(growth) > 1
            and periods * (abs(growth).bit_length() - 1) > MAX_EXACT_BITS
        ):
            raise ExtensionToolError(message)
        with arithmetic_guard(
            message, "1 + interest_rate is 0, so a negative number of periods is undefined"
        ):
            value = present * (growth**periods)
        return ensure_finite(value, message)


class CalculateInvestmentValueArguments(BaseModel):
    """Arguments of calculate_investment_value."""

    model_config = ConfigDict(extra="forbid")

    initial_investment: Integer = Field(description="The initial investment amount.")
    annual_contribution: Number = Field(
        description="The amount contributed at the end of each year."
    )
    years: Integer = Field(description="The number of years to calculate the investment value for.")
    annual_return: Number = Field(
        description="The annual return rate, as a fraction from 0 to 1 (0.05 = 5%)."
    )
    inflation_rate: list[Number] = Field(
        description=(
            "The inflation rate of each year, as fractions from 0 to 1 (0.02 = 2%); "
            "one value per year when adjusting for inflation."
        )
    )
    adjust_for_inflation: bool = Field(
        default=True, description="Whether to adjust the investment value for inflation."
    )


class CalculateInvestmentValue(Tool):
    """Calculate the value of an investment after a number of years.

    Each year the value grows by annual_return and the contribution is added; when
    adjusting for inflation, that year's inflation rate is taken off the growth and the
    contribution.
    """

    name = "calculate_investment_value"
    arguments_model = CalculateInvestmentValueArguments

    def call(
        self, arguments: CalculateInvestmentValueArguments, context: ExtensionContext
    ) -> int | float:
        """Return the inflation-adjusted value, or the nominal one when not adjusting."""
        years = arguments.years
        contribution = arguments.annual_contribution
        rate = arguments.annual_return
        inflation = arguments.inflation_rate
        adjust = arguments.adjust_for_inflation
        if adjust and len(inflation) < years:
            raise ExtensionToolError(
                f"inflation_rate needs one rate per year: {years} years but {len(inflation)} rates"
            )
        message = "the values are too large: the investment exceeds the float range"
        nominal: int | float = arguments.initial_investment
        real: int | float = arguments.initial_investment
        with arithmetic_guard(message):
            for year in range(1, years + 1):
                nominal = (nominal * (1 + rate)) + contribution
                if adjust:
                    yearly = inflation[year - 1]
                    real = (real * ((1 + rate) - yearly)) + (contribution * (1 - yearly))
                else:
                    real = nominal
        return ensure_finite(real if adjust else nominal, message)


class MortgageCalculatorArguments(BaseModel):
    """Arguments of mortgage_calculator."""

    model_config = ConfigDict(extra="forbid")

    loan_amount: Number = Field(description="The amount of the loan.")
    interest_rate: Number = Field(
        description="The annual interest rate of the loan, as a fraction (0.035 = 3.5%); not 0."
    )
    loan_period: Integer = Field(description="The period of the loan, in years (at least 1).")


class MortgageCalculator(Tool):
    """Calculate the monthly payment of a fixed-rate mortgage (annuity formula).

    With m = interest_rate / 12 and N = 12 * loan_period monthly payments, the payment is
    loan_amount * m * (1 + m)**N / ((1 + m)**N - 1), not rounded.
    """

    name = "mortgage_calculator"
    arguments_model = MortgageCalculatorArguments

    def call(self, arguments: MortgageCalculatorArguments, context: ExtensionContext) -> float:
        """Return the monthly payment as a float."""
        loan, rate, period = arguments.loan_amount, arguments.interest_rate, arguments.loan_period
        if rate == 0:
            raise ExtensionToolError("interest_rate must not be 0")
        if period < 1:
            raise ExtensionToolError(f"loan_period must be >= 1 year, got {period}")
        message = "the values are too large: the payment exceeds the float range"
        with arithmetic_guard(message, "interest_rate is too close to 0 for this loan_period"):
            monthly_rate = rate / 12
            payments = period * 12
            growth = (1 + monthly_rate) ** payments
            payment = ((loan * monthly_rate) * growth) / (growth - 1)
        return float(ensure_finite(payment, message))
