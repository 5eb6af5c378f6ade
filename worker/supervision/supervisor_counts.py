"""Calls a supervisor answers itself, counted in ``toolfleet_tool_calls_total``.

The worker processes count their calls in the multiprocess folder
(``PROMETHEUS_MULTIPROC_DIR``) that the supervisor serves on ``/metrics``. A call the
watchdog answers for a process that cannot is counted here, by the supervisor, in the
same folder and under the same metric, so the sum the scrape shows holds every call
once: prometheus-client's own per-process file (``counter_supervisor_<pid>.db``),
written through its :func:`~prometheus_client.values.MultiProcessValue`.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from prometheus_client import values

__all__ = ["CALLS_HELP", "CALLS_LABELS", "CALLS_NAME", "SupervisorCalls"]

#: ``toolfleet_tool_calls_total`` as :data:`toolfleet.worker.supervision.metrics.CALLS`
#: declares it (this module does not import that one: its import would make the
#: supervisor a process with metric files of its own).
CALLS_NAME = "toolfleet_tool_calls"
CALLS_HELP = "Tool calls answered, by function, extension, status and model."
CALLS_LABELS = ("function", "extension", "status", "model")


class SupervisorCalls:
    """Adds to ``toolfleet_tool_calls_total{function, extension, status, model}`` from here.

    Counts go to the multiprocess folder when ``PROMETHEUS_MULTIPROC_DIR`` is set (the
    supervisor sets it before starting this), else they are kept in memory only
    (:attr:`counts`; nothing serves them).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], Any] = {}
        #: label values -> count, also when no folder is set
        self.counts: dict[tuple[str, ...], float] = {}
        self._value_class: Any = (
            values.MultiProcessValue(lambda: f"supervisor_{os.getpid()}")  # type: ignore[no-untyped-call]
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR")
            else None
        )

    def inc(self, function: str, extension: str, status: str, model: str) -> None:
        """Count one call answered ``status``."""
        labels = (function, extension, status, model)
        with self._lock:
            self.counts[labels] = self.counts.get(labels, 0.0) + 1
            if self._value_class is None:
                return
            value = self._values.get(labels)
            if value is None:
                value = self._values[labels] = self._value_class(
                    "counter", CALLS_NAME, CALLS_NAME + "_total", CALLS_LABELS, labels, CALLS_HELP
                )
            value.inc(1)
