"""The type of the ``toolfleet_fleet`` fixture (importable without pytest)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from toolfleet.testing._fleet import RunningFleet
    from toolfleet.testing._sources import ExtensionSource

__all__ = ["FleetFactory"]


class FleetFactory(Protocol):
    """The type of the ``toolfleet_fleet`` fixture (for a test's annotations)."""

    def __call__(
        self,
        *extensions: ExtensionSource,
        processes: int = 1,
        threads: int = 4,
        entry_points: bool = False,
    ) -> RunningFleet:
        """Start a fleet serving ``extensions`` (see :func:`toolfleet.testing.start_fleet`)."""
        ...
