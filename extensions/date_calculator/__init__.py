"""Built-in extension ``date-calculator``: date arithmetic with time zones.

A model of a clean extension: a manifest (``extension.toml`` beside this file) with a
setting (``default_timezone``, env ``TOOLFLEET_EXT_DATE_CALCULATOR_DEFAULT_TIMEZONE``) and
a switch (``ext_date_calculator_logging``), and class-protocol tools.
"""

from pathlib import Path

from toolfleet.extensions.date_calculator.tools import AddDays, ConvertTimezone, DaysBetween, Now
from toolfleet.shared.extension import Extension
from toolfleet.shared.manifest import read_manifest

__all__ = ["extension"]

extension = Extension.from_manifest(
    read_manifest(Path(__file__).with_name("extension.toml")),
    tools=[AddDays, DaysBetween, Now, ConvertTimezone],
)
