"""Count a call the crash rule answered, from a worker process or from the supervisor.

Apart from :mod:`.metrics` so that the supervisor, which answers for its dead processes,
does not import the worker processes' metrics (their unlabelled series would get files of
the supervisor's own in the multiprocess folder).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from prometheus_client import values

from toolfleet.shared.naming import FUNCTION_NAME_RE

__all__ = ["CRASH_LOOPS_HELP", "count_crash_loop"]

#: The help text of ``toolfleet_crash_loops_total`` (one text in every process's file).
CRASH_LOOPS_HELP = (
    "Calls answered crashed and dead-lettered because their runs ended their worker "
    "process more than crash_reruns + 1 times, by function."
)

#: The multiprocess value class of a process that imported prometheus-client before its
#: multiprocess folder was set (the supervisor), made once; its values by label.
_late_class: Any = None
_late_values: dict[str, Any] = {}
_late_lock = threading.Lock()


def count_crash_loop(function: str) -> None:
    """Count one call answered ``crashed`` by the crash rule in ``toolfleet_crash_loops_total``.

    In a worker process (multiprocess mode from its start) an increment of
    :data:`~toolfleet.worker.supervision.metrics.CRASH_LOOPS`. The supervisor set its
    multiprocess folder only after prometheus-client was imported, so a counter of its
    own would stay in its memory, out of ``/metrics``: it writes the count to its own file
    in that folder instead, which ``/metrics`` sums with the worker processes' files.

    Args:
        function: the call's function name (a string not shaped like one counts as
            ``unknown``).
    """
    global _late_class
    label = function if FUNCTION_NAME_RE.fullmatch(function) else "unknown"
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") is None or getattr(
        values.ValueClass, "_multiprocess", False
    ):
        from toolfleet.worker.supervision import metrics

        metrics.child(metrics.CRASH_LOOPS, label).inc()
        return
    with _late_lock:
        if _late_class is None:
            _late_class = values.MultiProcessValue()  # type: ignore[no-untyped-call]
        value = _late_values.get(label)
        if value is None:
            value = _late_values[label] = _late_class(
                "counter", "toolfleet_crash_loops", "toolfleet_crash_loops_total",
                ("function",), (label,), CRASH_LOOPS_HELP,
            )  # fmt: skip
    value.inc(1)
