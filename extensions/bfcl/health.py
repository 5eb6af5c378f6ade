"""Health tools: daily nutritional needs."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.extensions.bfcl._common import (
    Integer,
    Number,
    arithmetic_guard,
    choice,
    ensure_finite,
)
from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = [
    "ACTIVITY_MULTIPLIERS",
    "CalculateNutritionalNeeds",
    "CalculateNutritionalNeedsArguments",
]

ACTIVITY_MULTIPLIERS = {1: 1.2, 2: 1.375, 3: 1.55, 4: 1.725, 5: 1.9}
"""Energy multiplier of each activity level, from sedentary (1) to very active (5)."""

_GENDERS = ("male", "female", "other")
_GOAL_ADJUSTMENTS = {"lose": -500, "gain": 500, "maintain": 0}


class CalculateNutritionalNeedsArguments(BaseModel):
    """Arguments of calculate_nutritional_needs."""

    model_config = ConfigDict(extra="forbid")

    weight: Number = Field(description="The weight of the person in kilograms.")
    height: Number = Field(description="The height of the person in centimeters.")
    age: Number = Field(description="The age of the person in years.")
    gender: choice(*_GENDERS) = Field(  # type: ignore[valid-type]
        description="The gender of the person: male, female or other."
    )
    activity_level: Integer = Field(
        description="The activity level of the person, from 1 (sedentary) to 5 (very active)."
    )
    goal: choice(*_GOAL_ADJUSTMENTS) = Field(  # type: ignore[valid-type]
        description="The goal of the person: lose, gain or maintain."
    )


class CalculateNutritionalNeeds(Tool):
    """Calculate daily calories and macronutrients from body data, activity and goal.

    Uses the revised Harris-Benedict equations for the basal metabolic rate, an activity
    multiplier, -500 kcal to lose or +500 kcal to gain weight, and a 30/25/45 split of
    calories between proteins, fats and carbohydrates (in grams).
    """

    name = "calculate_nutritional_needs"
    arguments_model = CalculateNutritionalNeedsArguments

    def call(
        self, arguments: CalculateNutritionalNeedsArguments, context: ExtensionContext
    ) -> dict[str, float]:
        """Return calories, proteins_g, fats_g and carbohydrates_g (not rounded)."""
        weight, height, age = arguments.weight, arguments.height, arguments.age
        if arguments.gender not in _GENDERS:
            raise ExtensionToolError(
                f"gender must be one of male, female, other; got {arguments.gender!r}"
            )
        if arguments.activity_level not in ACTIVITY_MULTIPLIERS:
            raise ExtensionToolError(
                f"activity_level must be an integer from 1 to 5, got {arguments.activity_level}"
            )
        if arguments.goal not in _GOAL_ADJUSTMENTS:
            raise ExtensionToolError(
                f"goal must be one of lose, gain, maintain; got {arguments.goal!r}"
            )
        message = "weight, height and age are too large for a float computation"
        with arithmetic_guard(message):
            if arguments.gender == "male":
                bmr = ((88.362 + (13.397 * weight)) + (4.799 * height)) - (5.677 * age)
            else:
                bmr = ((447.593 + (9.247 * weight)) + (3.098 * height)) - (4.330 * age)
            calories = bmr * ACTIVITY_MULTIPLIERS[arguments.activity_level]
            adjustment = _GOAL_ADJUSTMENTS[arguments.goal]
            if adjustment:
                calories = calories + adjustment
            needs = {
                "calories": calories,
                "proteins_g": (calories * 0.30) / 4,
                "fats_g": (calories * 0.25) / 9,
                "carbohydrates_g": (calories * 0.45) / 4,
            }
        return ensure_finite(needs, message)
