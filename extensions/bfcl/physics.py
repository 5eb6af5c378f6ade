"""Physics tools: density, displacement, final velocity, electrostatic potential energy."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.extensions.bfcl._common import Number, arithmetic_guard, ensure_finite
from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = [
    "CalculateDensity",
    "CalculateDensityArguments",
    "CalculateDisplacement",
    "CalculateDisplacementArguments",
    "CalculateElectrostaticPotentialEnergy",
    "CalculateElectrostaticPotentialEnergyArguments",
    "CalculateFinalVelocity",
    "CalculateFinalVelocityArguments",
]

_RANGE = "the values are too large: the result exceeds the float range"


class CalculateDensityArguments(BaseModel):
    """Arguments of calculate_density."""

    model_config = ConfigDict(extra="forbid")

    mass: Number = Field(description="The mass of the object, in kilograms.")
    volume: Number = Field(description="The volume of the object, in cubic meters; not 0.")


class CalculateDensity(Tool):
    """Calculate the density of an object: mass / volume."""

    name = "calculate_density"
    arguments_model = CalculateDensityArguments

    def call(self, arguments: CalculateDensityArguments, context: ExtensionContext) -> float:
        """Return ``mass / volume`` as a float."""
        if arguments.volume == 0:
            raise ExtensionToolError("volume must not be 0")
        with arithmetic_guard(_RANGE):
            density = arguments.mass / arguments.volume
        return float(ensure_finite(density, _RANGE))


class CalculateDisplacementArguments(BaseModel):
    """Arguments of calculate_displacement."""

    model_config = ConfigDict(extra="forbid")

    initial_velocity: Number = Field(
        description="The initial velocity of the object, in meters per second."
    )
    acceleration: Number = Field(
        description="The acceleration of the object, in meters per second squared."
    )
    time: Number = Field(description="The time the object has been moving, in seconds.")


class CalculateDisplacement(Tool):
    """Calculate the displacement of an object under constant acceleration.

    Displacement = initial_velocity * time + 0.5 * acceleration * time**2.
    """

    name = "calculate_displacement"
    arguments_model = CalculateDisplacementArguments

    def call(self, arguments: CalculateDisplacementArguments, context: ExtensionContext) -> float:
        """Return ``(v0 * t) + ((0.5 * a) * (t ** 2))``."""
        v0, a, t = arguments.initial_velocity, arguments.acceleration, arguments.time
        with arithmetic_guard(_RANGE):
            displacement = (v0 * t) + ((0.5 * a) * (t**2))
        return float(ensure_finite(displacement, _RANGE))


class CalculateElectrostaticPotentialEnergyArguments(BaseModel):
    """Arguments of calculate_electrostatic_potential_energy."""

    model_config = ConfigDict(extra="forbid")

    charge: Number = Field(description="The charge of the object, in coulombs.")
    voltage: Number = Field(description="The voltage of the object, in volts.")


class CalculateElectrostaticPotentialEnergy(Tool):
    """Calculate the electrostatic potential energy, in joules: charge * voltage."""

    name = "calculate_electrostatic_potential_energy"
    arguments_model = CalculateElectrostaticPotentialEnergyArguments

    def call(
        self,
        arguments: CalculateElectrostaticPotentialEnergyArguments,
        context: ExtensionContext,
    ) -> int | float:
        """Return ``charge * voltage`` (an integer when both are integers)."""
        with arithmetic_guard(_RANGE):
            energy = arguments.charge * arguments.voltage
        return ensure_finite(energy, _RANGE)


class CalculateFinalVelocityArguments(BaseModel):
    """Arguments of calculate_final_velocity."""

    model_config = ConfigDict(extra="forbid")

    initial_velocity: Number = Field(
        description="The initial velocity of the object, in meters per second."
    )
    acceleration: Number = Field(
        description="The acceleration of the object, in meters per second squared."
    )
    time: Number = Field(description="The time the object has been moving, in seconds.")


class CalculateFinalVelocity(Tool):
    """Calculate the final velocity of an object under constant acceleration.

    Final velocity = initial_velocity + acceleration * time.
    """

    name = "calculate_final_velocity"
    arguments_model = CalculateFinalVelocityArguments

    def call(
        self, arguments: CalculateFinalVelocityArguments, context: ExtensionContext
    ) -> int | float:
        """Return ``v0 + (a * t)`` (an integer when all three are integers)."""
        v0, a, t = arguments.initial_velocity, arguments.acceleration, arguments.time
        with arithmetic_guard(_RANGE):
            velocity = v0 + (a * t)
        return ensure_finite(velocity, _RANGE)
