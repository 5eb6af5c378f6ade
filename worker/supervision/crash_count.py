"""Count a call the crash rule answered, from a worker process or from the supervisor.

Apart from :mod:`.metrics` so that the supervisor, which answers for its dead processes,
does not import the worker processes' metrics (their unlabelled series would get files of
the supervisor's own in the multiprocess folder).
"""

from __future__ import annotations

import threading

from toolfleet.shared.naming import FUNCTION_NAME_RE
from toolfleet.worker.supervision.supervisor_counts import FolderCounter

__all__ = ["CRASH_LOOPS_HELP", "count_crash_loop"]

#: The help text of ``toolfleet_crash_loops_total`` (one text in every process's file).
CRASH_LOOPS_HELP = (
    "Calls answered crashed and dead-lettered because their runs ended their worker "
    "process more than crash_reruns + 1 times, by function."
)

_counter: FolderCounter | None = None
_lock = threading.Lock()


def count_crash_loop(function: str) -> None:
    """Count one call answered ``crashed`` by the crash rule in ``toolfleet_crash_loops_total``.

    Written to the process's own file in the multiprocess folder (made on the first
    count, once the folder is set), which ``/metrics`` sums with the other processes'.

    Args:
        function: the call's function name (a string not shaped like one counts as
            ``unknown``).
    """
    global _counter
    with _lock:
        if _counter is None:
            _counter = FolderCounter("toolfleet_crash_loops", CRASH_LOOPS_HELP, ("function",))
    _counter.inc(function if FUNCTION_NAME_RE.fullmatch(function) else "unknown")
