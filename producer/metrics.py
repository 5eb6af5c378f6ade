"""Prometheus metrics of the producer side, in a registry of their own.

The host application serves them with its own exposition, e.g.
``prometheus_client.generate_latest(toolfleet.producer.metrics.REGISTRY)``, or puts them
in its own registry with :func:`register` (``register(prometheus_client.REGISTRY)``: its
``/metrics`` then shows them). Base units: seconds.
"""

from __future__ import annotations

import weakref

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = [
    "CALLS",
    "CALL_DURATION",
    "LATE_REPLIES",
    "REFUSED",
    "REGISTRY",
    "UNKNOWN_FUNCTIONS",
    "register",
]

#: The producer's registry (separate from the host application's default one).
REGISTRY = CollectorRegistry(auto_describe=True)

CALL_DURATION = Histogram(
    "toolfleet_client_call_duration_seconds",
    "End-to-end time of a call as its caller saw it, seconds, by function and status.",
    ["function", "status"],
    buckets=(
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        1.0,
        2.5,
        5.0,
        10.0,
        30.0,
        60.0,
    ),
    registry=REGISTRY,
)
#: Registries that hold the metrics below (the producer's own, and those of :func:`register`).
_HOLDING: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet([REGISTRY])

LATE_REPLIES = Counter(
    "toolfleet_client_late_replies",
    "Replies that came after their call was resolved (timeout, cancel) or twice: dropped.",
    registry=REGISTRY,
)


#: Labels: the function (bounded by the catalog) and the reason (``in_flight``, ``per_s``,
#: ``breaker``); never the account, whose number has no bound (``toolfleet limits list``
#: and the events name accounts).
REFUSED = Counter(
    "toolfleet_client_refused",
    "Calls refused at publish by an account quota or an open breaker (nothing published).",
    ["function", "reason"],
    registry=REGISTRY,
)

#: Labels: the model (``quality_models`` bound, :func:`toolfleet.shared.metric_labels.model_label`)
#: and the name asked for (its first 100 distinct names, then ``unknown``:
#: :class:`toolfleet.shared.metric_labels.AskedNames`).
UNKNOWN_FUNCTIONS = Counter(
    "toolfleet_client_unknown_functions",
    "Calls to a function the catalog does not hold (answered unknown_function), by model and name.",
    ["model", "asked"],
    registry=REGISTRY,
)

#: The calls this producer answered itself (never published: an unknown function, no live
#: worker, over a quota, an open breaker, a bad call), under the workers' metric name and
#: labels, so ``sum(toolfleet_tool_calls_total)`` over workers and producers counts every
#: call once. ``extension`` is empty; ``function`` is ``unknown`` for a name the catalog
#: does not hold (:mod:`toolfleet.producer.refusals`).
CALLS = Counter(
    "toolfleet_tool_calls_total",
    "Tool calls answered, by function, extension, status and model.",
    ["function", "extension", "status", "model"],
    registry=REGISTRY,
)

_ALL = (CALL_DURATION, CALLS, LATE_REPLIES, REFUSED, UNKNOWN_FUNCTIONS)


def register(registry: CollectorRegistry = REGISTRY) -> None:
    """Add the producer's metrics to ``registry`` too (the host application's, say).

    The same series then show in both registries; calling it again is harmless.

    Args:
        registry: the registry to add them to; by default the producer's own
            :data:`REGISTRY`, which already holds them.

    Raises:
        ValueError: ``registry`` holds another collector of one of these names.
    """
    if registry in _HOLDING:
        return
    done = []
    try:
        for collector in _ALL:
            registry.register(collector)
            done.append(collector)
    except ValueError:
        for collector in done:  # all or nothing
            registry.unregister(collector)
        raise
    _HOLDING.add(registry)
