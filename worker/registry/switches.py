"""Switch states, read from Redis and refreshed while the worker runs (no restart needed)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from toolfleet.shared.catalog import switch_states
from toolfleet.shared.naming import switches_key

__all__ = ["SwitchBoard"]


class SwitchBoard:
    """The ``<ns>:switches`` hash (name -> ``on``/``off``), cached between refreshes.

    Args:
        namespace: key prefix.
        defaults: state of declared switches when Redis holds none; any other switch is on.
    """

    def __init__(self, namespace: str, defaults: dict[str, bool] | None = None) -> None:
        self.namespace = namespace
        self.defaults = dict(defaults or {})
        self._states: dict[str, bool] = {}
        self._loaded: Mapping[Any, Any] | None = None  # the mapping last loaded

    def refresh(self, client: redis.Redis) -> None:
        """Read every switch state (one round trip)."""
        self.load(client.hgetall(switches_key(self.namespace)))

    def load(self, raw: Mapping[Any, Any]) -> None:
        """Take every switch state from ``raw``, the ``<ns>:switches`` hash as read.

        The calls of one fetched batch share one read: it is parsed once, not per call.
        """
        if raw is self._loaded:
            return
        self._loaded = raw
        self._states = switch_states(raw)

    def adopt(self, states: Mapping[str, bool]) -> None:
        """Take ``states`` (a :meth:`snapshot` of another board) as the states Redis holds."""
        self._states = dict(states)
        self._loaded = None

    @property
    def states(self) -> dict[str, bool]:
        """The switch states Redis holds (switches never set are absent)."""
        return self._states

    def snapshot(self) -> dict[str, bool]:
        """Every switch state known now (for a child process)."""
        return {**self.defaults, **self._states}

    def is_on(self, name: str) -> bool:
        """State of switch ``name`` (its full name, e.g. ``ext_dates_logging``)."""
        if name in self._states:
            return self._states[name]
        return self.defaults.get(name, True)
