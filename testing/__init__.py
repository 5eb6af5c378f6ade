"""Test helpers for extension authors: ``run_tool``, real fleets, and a pytest plugin.

- :func:`run_tool` answers one call in the test's process exactly as a worker would
  (arguments parsed and validated, time limit, error mapping, reply encoding), no Redis.
- :func:`start_fleet` starts real worker processes on a Redis; :class:`RunningFleet` is
  what it returns.
- The pytest plugin (:mod:`toolfleet.testing.pytest_plugin`, loaded by pytest through the
  ``pytest11`` entry point) gives the ``toolfleet_redis`` and ``toolfleet_fleet`` fixtures;
  :class:`FleetFactory` is the type of the latter.

The names are imported on first use, so that pytest loading the plugin imports no worker
code; nothing here but the plugin imports pytest.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from toolfleet.testing._types import FleetFactory

if TYPE_CHECKING:
    from toolfleet.testing._fleet import RunningFleet, start_fleet
    from toolfleet.testing._run import run_tool
    from toolfleet.testing._sources import ExtensionSource

__all__ = ["ExtensionSource", "FleetFactory", "RunningFleet", "run_tool", "start_fleet"]

_HOMES = {
    "ExtensionSource": "toolfleet.testing._sources",
    "RunningFleet": "toolfleet.testing._fleet",
    "run_tool": "toolfleet.testing._run",
    "start_fleet": "toolfleet.testing._fleet",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
