"""Prometheus metrics of the producer side, in a registry of their own.

The host application serves them with its own exposition, e.g.
``prometheus_client.generate_latest(toolfleet.producer.metrics.REGISTRY)``, or merges
them into its default registry. Base units: seconds.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["CALL_DURATION", "LATE_REPLIES", "REGISTRY"]

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
LATE_REPLIES = Counter(
    "toolfleet_client_late_replies",
    "Replies that came after their call was resolved (timeout, cancel) or twice: dropped.",
    registry=REGISTRY,
)
