"""Tools in multi-llm-ts's plugin shape: isEnabled(), getPreparationDescription(), descriptions.

``Weather`` is enabled only while the file named by ``TFTEST_WEATHER_FLAG`` exists, so a
test can switch it at run time; every run appends a line to ``TFTEST_WEATHER_RUNS``.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from pydantic import BaseModel, Field

from toolfleet.shared import Extension, ExtensionContext, Tool


class WeatherArguments(BaseModel):
    city: str = Field(description="The city.")
    days: int = Field(default=1, description="How many days ahead.")


class Weather(Tool):
    """Weather forecast for a city."""

    name = "weather"
    arguments_model = WeatherArguments

    def isEnabled(self) -> bool:  # noqa: N802 - multi-llm-ts's own name
        return Path(os.environ["TFTEST_WEATHER_FLAG"]).exists()

    def getPreparationDescription(self, tool: str) -> str:  # noqa: N802
        return "Preparing the forecast for {city}"

    def running_description(self, arguments: WeatherArguments) -> str:
        return f"Looking up the weather in {arguments.city}"

    def canceled_description(self, arguments: WeatherArguments) -> str:
        return f"Weather lookup for {arguments.city} canceled"

    async def call(self, arguments: WeatherArguments, context: ExtensionContext) -> str:
        with open(os.environ["TFTEST_WEATHER_RUNS"], "a") as runs:
            runs.write(arguments.city + "\n")
        if arguments.city == "Slowtown":
            await asyncio.sleep(30)
        return f"sunny in {arguments.city} for {arguments.days} day(s)"


extension = Extension(slug="mllm-seed", version="1.0.0", tools=[Weather], timeout_s=40.0)
