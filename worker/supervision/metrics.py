"""Prometheus metrics of the worker side (prometheus-client, multiprocess mode).

Each worker process writes its samples to ``PROMETHEUS_MULTIPROC_DIR`` (the operator's
folder, or the supervisor's private one); the supervisor empties that folder at start,
marks a dead process's gauges dead (so its live series disappear) and serves the
aggregate on ``/metrics``. Counters of dead processes stay in the sum, so a counter never
goes backwards between scrapes. Base units: seconds.
"""

from __future__ import annotations

import bisect
import threading
from typing import Any, TypeVar

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.metrics import MetricWrapperBase

from toolfleet.shared.buckets import PROMETHEUS_BUCKETS_S
from toolfleet.worker.supervision.supervisor_counts import CALLS_HELP, CALLS_LABELS, CALLS_NAME

__all__ = [
    "BREAKER_OPEN",
    "BREAKER_REFUSED",
    "CALLS",
    "CATALOG_COLLISIONS",
    "CLAIMS_UNREPLICATED",
    "CONCURRENCY_WAIT",
    "CALL_DURATION",
    "EXTENSION_LOAD_ERRORS",
    "IN_FLIGHT",
    "INVALID_ARGUMENTS",
    "INVALID_FIELDS",
    "MCP_SERVERS",
    "MCP_SERVER_RESTARTS",
    "OVERSIZE",
    "POISON_MESSAGES",
    "QUEUE_WAIT",
    "SHAPED",
    "STUCK_THREADS",
    "WORKER_UP",
    "Tally",
    "child",
]

M = TypeVar("M", bound=MetricWrapperBase)

#: (metric, label values) -> its child: each label set looked up in the metric once.
_children: dict[tuple[Any, tuple[str, ...]], Any] = {}


def child(metric: M, *labels: str) -> M:
    """``metric.labels(*labels)``, made once per label set and kept for this process.

    The same child prometheus-client returns (it keeps every label set a metric was given
    anyway), without its checks and lock at each update: for the metrics updated once per
    call. Label sets are bounded by what a process serves, as the metric's own are.

    Raises:
        ValueError: the label values do not match the metric's label names.
    """
    key = (metric, labels)
    found = _children.get(key)
    if found is None:
        found = _children[key] = metric.labels(*labels)
    return found


class Tally:
    """Per-call counter, gauge and histogram updates kept in memory, written once per batch.

    A write to prometheus-client's multiprocess files takes a lock, a pid check and an
    mmap write per value; a worker process adds up the calls it answers instead and hands
    the sums to prometheus-client in :meth:`flush`, once per group commit (right after
    its calls are written and counted) and each second: one increment per label set and
    batch for a counter, one per bucket and one for the sum for a histogram. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[Any, tuple[str, ...]], float] = {}
        self._observed: dict[tuple[Any, tuple[str, ...]], list[float]] = {}

    def inc(self, metric: Counter | Gauge, labels: tuple[str, ...], amount: float = 1.0) -> None:
        """Add ``amount`` to ``metric{labels}`` at the next flush.

        A gauge takes negative amounts too (``-1``: one fewer); what nets to zero between
        two flushes writes nothing (the series is still made).
        """
        key = (metric, labels)
        with self._lock:
            self._counts[key] = self._counts.get(key, 0.0) + amount

    def observe(self, metric: Histogram, labels: tuple[str, ...], value: float) -> None:
        """Observe ``value`` in ``metric{labels}`` at the next flush."""
        key = (metric, labels)
        with self._lock:
            found = self._observed.get(key)
            if found is None:
                self._observed[key] = [value]
            else:
                found.append(value)

    def flush(self) -> None:
        """Write what accumulated to prometheus-client."""
        with self._lock:
            if not self._counts and not self._observed:
                return
            counts, self._counts = self._counts, {}
            observed, self._observed = self._observed, {}
        for (metric, labels), amount in counts.items():
            series = child(metric, *labels)
            if amount:
                series.inc(amount)
        for (metric, labels), values in observed.items():
            _observe_all(child(metric, *labels), values)


def _observe_all(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for each value, one write per bucket hit and one for the sum.

    What prometheus-client's ``Histogram.observe`` does per value (its ``_sum``,
    ``_upper_bounds`` and ``_buckets``), summed first.
    """
    bounds = histogram._upper_bounds
    hits: dict[int, int] = {}
    for value in values:
        index = bisect.bisect_left(bounds, value)  # the first bound >= value
        if index < len(bounds):
            hits[index] = hits.get(index, 0) + 1
    histogram._sum.inc(sum(values))
    for index, count in hits.items():
        histogram._buckets[index].inc(count)


#: Execution-time and queue-wait buckets, 1 ms to 100 s, 20 a decade (about 12 % wide):
#: every second bound of the per-minute aggregates', so the dashboard's
#: ``histogram_quantile`` and the ops page read the same bucket edges
#: (:mod:`toolfleet.shared.buckets`).
DURATION_BUCKETS = PROMETHEUS_BUCKETS_S

#: ``function`` labels are served function names, any other name counts under ``unknown``
#: (:func:`toolfleet.shared.metric_labels.function_label`); never accounts.
BREAKER_OPEN = Gauge(
    "toolfleet_breaker_open",
    "1 while a function's circuit breaker is open or half-open as this process last saw it.",
    ["function"],
    multiprocess_mode="livemax",
)
BREAKER_REFUSED = Counter(
    "toolfleet_breaker_refused_total",
    "Calls answered not_available at once by an open circuit breaker, by function.",
    ["function"],
)
CATALOG_COLLISIONS = Gauge(
    "toolfleet_catalog_collisions",
    "1 while this process's tool is refused a function name another tool holds fleet-wide.",
    ["function"],
    multiprocess_mode="livemax",
)
CLAIMS_UNREPLICATED = Counter(
    "toolfleet_claims_unreplicated_total",
    "Claims of non-idempotent calls fewer replicas acknowledged than claim_replicas within "
    "claim_replicas_timeout_ms (the call ran anyway), by function.",
    ["function"],
)
CONCURRENCY_WAIT = Histogram(
    "toolfleet_concurrency_wait_seconds",
    "Time a call of a concurrency-limited function waited for a fleet-wide slot, seconds.",
    ["function"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
#: ``model`` labels are the names in the ``quality_models`` allow-list, ``other`` or
#: ``none`` (:func:`toolfleet.shared.metric_labels.model_label`).
CALLS = Counter(CALLS_NAME + "_total", CALLS_HELP, CALLS_LABELS)  # the supervisor adds too
CALL_DURATION = Histogram(
    "toolfleet_tool_call_duration_seconds",
    "Time a tool ran, seconds.",
    ["function", "model"],
    buckets=DURATION_BUCKETS,
)
QUEUE_WAIT = Histogram(
    "toolfleet_queue_wait_seconds",
    "Time between publishing a call and a worker taking it, seconds.",
    ["queue"],
    buckets=DURATION_BUCKETS,
)
IN_FLIGHT = Gauge(
    "toolfleet_calls_in_flight",
    "Calls running now.",
    ["function"],
    multiprocess_mode="livesum",
)
INVALID_ARGUMENTS = Counter(
    "toolfleet_invalid_arguments_total",
    "Calls whose arguments did not parse or validate (a bad description or schema shows here).",
    ["function", "model"],
)
#: ``field``: a declared argument, ``(arguments)`` or ``(undeclared)``
#: (:func:`toolfleet.shared.metric_labels.field_label`); ``reason``: one of
#: :data:`toolfleet.shared.aggregates.REASONS`.
INVALID_FIELDS = Counter(
    "toolfleet_invalid_argument_fields_total",
    "Failing arguments of invalid_arguments calls, by function, model, field and reason.",
    ["function", "model", "field", "reason"],
)
SHAPED = Counter(
    "toolfleet_results_shaped_total",
    'Results cut to fit their byte budget (result_shaping = "truncate"), by function.',
    ["function"],
)
EXTENSION_LOAD_ERRORS = Counter(
    "toolfleet_extension_load_errors_total",
    "Extensions that failed to load, by source.",
    ["extension"],
)
POISON_MESSAGES = Counter(
    "toolfleet_poison_messages_total",
    "Messages that could not be decoded and were dead-lettered.",
    ["queue"],
)
STUCK_THREADS = Gauge(
    "toolfleet_stuck_threads",
    "Abandoned tool threads still running, per worker process.",
    multiprocess_mode="liveall",
)
WORKER_UP = Gauge(
    "toolfleet_worker_up",
    "1 for each live worker process.",
    multiprocess_mode="liveall",
)
MCP_SERVERS = Gauge(
    "toolfleet_mcp_server_processes",
    "MCP server processes running for the worker processes (one per stdio MCP extension each).",
    ["extension"],
    multiprocess_mode="livesum",
)
MCP_SERVER_RESTARTS = Counter(
    "toolfleet_mcp_server_restarts_total",
    "MCP sessions restarted after their server died or closed the connection.",
    ["extension"],
)
OVERSIZE = Counter(
    "toolfleet_oversize_total",
    "Arguments (answered rejected) and results (answered tool_error) over their size limit.",
    ["kind"],
)
