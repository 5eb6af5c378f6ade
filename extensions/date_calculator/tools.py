"""The date-calculator tools (class protocol)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool

__all__ = ["AddDays", "ConvertTimezone", "DaysBetween", "Now"]


def _zone(name: str | None, context: ExtensionContext) -> ZoneInfo:
    zone = str(name or getattr(context.settings, "default_timezone", None) or "UTC")
    try:
        return ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise ExtensionToolError(f"timezone: unknown IANA time zone {zone!r}") from None


def _date(value: str, argument: str) -> dt.date:
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise ExtensionToolError(f"{argument}: not an ISO date (YYYY-MM-DD): {value!r}") from None


def _log(context: ExtensionContext, message: str, *args: object) -> None:
    if context.switch_is_active("logging"):
        context.logger.info(message, *args)


class AddDaysArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    date: str = Field(description="ISO date, e.g. 2026-11-29.")
    days: int = Field(description="Days to add; negative to go back.")


class AddDays(Tool):
    """Add a number of days to a date and return the new ISO date."""

    name = "add_days"
    arguments_model = AddDaysArguments

    def call(self, arguments: AddDaysArguments, context: ExtensionContext) -> str:
        """Return ``date + days`` as an ISO date; dates outside years 1-9999 are a tool error."""
        start = _date(arguments.date, "date")
        try:
            result = start + dt.timedelta(days=arguments.days)
        except OverflowError:
            raise ExtensionToolError("days: the result is outside years 1-9999") from None
        _log(context, "add_days %s %+d -> %s", start, arguments.days, result)
        return result.isoformat()


class DaysBetweenArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    start: str = Field(description="ISO start date.")
    end: str = Field(description="ISO end date.")


class DaysBetween(Tool):
    """Count the days from start to end (negative when end is earlier)."""

    name = "days_between"
    arguments_model = DaysBetweenArguments

    def call(self, arguments: DaysBetweenArguments, context: ExtensionContext) -> int:
        """Return ``end - start`` in days."""
        return (_date(arguments.end, "end") - _date(arguments.start, "start")).days


class NowArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    timezone: str | None = Field(
        default=None, description="IANA time zone; default: the extension's setting."
    )


class Now(Tool):
    """The current date and time in a time zone, as ISO 8601 with offset."""

    name = "now"
    arguments_model = NowArguments

    def call(self, arguments: NowArguments, context: ExtensionContext) -> str:
        """Return the current time in the zone, to the second."""
        return dt.datetime.now(_zone(arguments.timezone, context)).isoformat(timespec="seconds")


class ConvertTimezoneArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    datetime: str = Field(description="ISO date-time, e.g. 2026-11-29T09:30:00.")
    from_timezone: str | None = Field(
        default=None, description="Zone of a date-time without offset; default: the setting."
    )
    to_timezone: str = Field(description="IANA time zone to convert to.")


class ConvertTimezone(Tool):
    """Convert a date-time from one IANA time zone to another."""

    name = "convert_timezone"
    arguments_model = ConvertTimezoneArguments

    def call(self, arguments: ConvertTimezoneArguments, context: ExtensionContext) -> str:
        """Return the date-time converted to ``to_timezone`` (ISO 8601 with offset)."""
        try:
            moment = dt.datetime.fromisoformat(arguments.datetime)
        except ValueError:
            raise ExtensionToolError(f"datetime: not ISO 8601: {arguments.datetime!r}") from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=_zone(arguments.from_timezone, context))
        return moment.astimezone(_zone(arguments.to_timezone, context)).isoformat()
