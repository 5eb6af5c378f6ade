"""Counters a supervisor (or any process) adds to in the multiprocess metrics folder.

The worker processes count their calls in the multiprocess folder
(``PROMETHEUS_MULTIPROC_DIR``) that the supervisor serves on ``/metrics``. A call the
watchdog or the crash rule answers for a process that cannot is counted by whoever
answers it, in the same folder and under the same metric, so the sum the scrape shows
holds every call once: prometheus-client's own per-process file
(``counter_supervisor_<pid>.db``), written through its
:func:`~prometheus_client.values.MultiProcessValue`. This works in a process that
imported prometheus-client before its folder was set (the supervisor), where a
``Counter`` would stay in memory.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from prometheus_client import values

__all__ = ["CALLS_HELP", "CALLS_LABELS", "CALLS_NAME", "FolderCounter", "SupervisorCalls"]

#: ``toolfleet_tool_calls_total`` as :data:`toolfleet.worker.supervision.metrics.CALLS`
#: declares it (this module does not import that one: its import would make the
#: supervisor a process with metric files of its own).
CALLS_NAME = "toolfleet_tool_calls"
CALLS_HELP = "Tool calls answered, by function, extension, status and model."
CALLS_LABELS = ("function", "extension", "status", "model")


class FolderCounter:
    """A counter written straight to the multiprocess folder, by label values.

    Counts go to the folder when ``PROMETHEUS_MULTIPROC_DIR`` is set at construction,
    else they are kept in memory only (:attr:`counts`; nothing serves them).

    Args:
        name: the metric's name without ``_total`` (e.g. ``toolfleet_tool_calls``).
        documentation: its help text, the same text every process declares.
        labelnames: its label names, in order.
    """

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self._lock = threading.Lock()
        self._values: dict[tuple[str, ...], Any] = {}
        #: label values -> count, also when no folder is set
        self.counts: dict[tuple[str, ...], float] = {}
        self._value_class: Any = (
            values.MultiProcessValue(lambda: f"supervisor_{os.getpid()}")  # type: ignore[no-untyped-call]
            if os.environ.get("PROMETHEUS_MULTIPROC_DIR")
            else None
        )

    def inc(self, *labels: str) -> None:
        """Count one, under the label values ``labels`` (in :attr:`labelnames` order)."""
        with self._lock:
            self.counts[labels] = self.counts.get(labels, 0.0) + 1
            if self._value_class is None:
                return
            value = self._values.get(labels)
            if value is None:
                value = self._values[labels] = self._value_class(
                    "counter", self.name, self.name + "_total", self.labelnames, labels,
                    self.documentation,
                )  # fmt: skip
            value.inc(1)


class SupervisorCalls(FolderCounter):
    """Adds to ``toolfleet_tool_calls_total{function, extension, status, model}`` from here."""

    def __init__(self) -> None:
        super().__init__(CALLS_NAME, CALLS_HELP, CALLS_LABELS)
