"""The pytest plugin of ``toolfleet.testing`` (entry point ``pytest11``: ``toolfleet``).

Fixtures:

- ``toolfleet_redis`` (session): the URL (``unix://...``) of an embedded Redis-compatible
  server started for the session (the ``demo`` extra's Valkey, or ``redis-server`` /
  ``valkey-server`` on ``PATH``), stopped at the end. Override it in a ``conftest.py``
  to use another Redis.
- ``toolfleet_fleet`` (function): a factory, ``toolfleet_fleet("mypkg.tools:extension",
  processes=1)``, that starts real worker processes on ``toolfleet_redis`` and returns a
  :class:`~toolfleet.testing.RunningFleet` (``.client``, ``.url``); every fleet it started
  is stopped, and its keys deleted, at the test's teardown.

The module imports only pytest (and a ``typing.Protocol``): toolfleet is imported when a
test asks for a fixture, so a suite that uses neither pays nothing. ``-p no:toolfleet``
turns the plugin off.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from toolfleet.testing._types import FleetFactory

if TYPE_CHECKING:
    from toolfleet.testing._fleet import RunningFleet
    from toolfleet.testing._sources import ExtensionSource

__all__ = ["toolfleet_fleet", "toolfleet_redis"]


@pytest.fixture(scope="session")
def toolfleet_redis() -> Iterator[str]:
    """The URL of an embedded Redis-compatible server, one per test session."""
    from toolfleet.shared.errors import ConfigurationError
    from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis

    server = EmbeddedRedis()
    try:
        server.start()
    except ConfigurationError as exc:
        pytest.fail(f"toolfleet_redis: {exc}", pytrace=False)
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def toolfleet_fleet(toolfleet_redis: str) -> Iterator[FleetFactory]:
    """A factory of fleets on ``toolfleet_redis``; each is stopped when the test ends."""
    from toolfleet.testing._fleet import start_fleet

    started: list[RunningFleet] = []

    def start(
        *extensions: ExtensionSource,
        processes: int = 1,
        threads: int = 4,
        entry_points: bool = False,
    ) -> RunningFleet:
        fleet = start_fleet(
            *extensions,
            redis_url=toolfleet_redis,
            processes=processes,
            threads=threads,
            entry_points=entry_points,
        )
        started.append(fleet)
        return fleet

    yield start
    for fleet in reversed(started):
        fleet.stop()
