"""Latency bucket bounds, log-spaced, that the aggregates and Prometheus agree on.

A histogram with fixed bounds reports a quantile somewhere inside the bucket that holds
it; its error is at most that bucket's width. Bounds spaced evenly on a log scale make
that error the same share of the value at every scale: the aggregates'
:data:`AGGREGATE_BUCKETS_S` are 40 a decade (each bucket about 5.9 % wide, so a quantile
interpolated inside one is within about 3 % of the true value), from 100 µs to 1,000 s.
Prometheus' duration histograms take every second bound between 1 ms and 100 s
(:data:`PROMETHEUS_BUCKETS_S`, 20 a decade, about 12 % wide): the same values, so the
ops page, ``toolfleet quality`` and the Grafana dashboard's ``histogram_quantile`` read
the same bucket edges, at 101 series per label set instead of 281.

Bounds are rounded to four significant digits (``le="0.05012"``), so they print the same
in every process and language.
"""

from __future__ import annotations

import math

__all__ = ["AGGREGATE_BUCKETS_S", "PER_DECADE", "PROMETHEUS_BUCKETS_S", "log_bounds"]

#: Aggregate bounds per decade (a power of ten is a bound; each bucket is 10^(1/40) wide).
PER_DECADE = 40


def log_bounds(low_s: float, high_s: float, per_decade: int = PER_DECADE) -> tuple[float, ...]:
    """Bounds ``10 ** (k / per_decade)`` from ``low_s`` to ``high_s`` (both seconds, included).

    Each is rounded to four significant digits. Raises :class:`ValueError` for a
    non-positive or empty range.
    """
    if not 0 < low_s <= high_s or per_decade < 1:
        raise ValueError(f"no bounds from {low_s} to {high_s} at {per_decade} a decade")
    first = math.ceil(round(math.log10(low_s) * per_decade, 6))
    last = math.floor(round(math.log10(high_s) * per_decade, 6))
    return tuple(float(f"{10 ** (k / per_decade):.4g}") for k in range(first, last + 1))


#: Upper bounds of the aggregates' wait and run-time buckets, seconds: 100 µs to 1,000 s,
#: 40 a decade (281 bounds; one more bucket holds the rest).
AGGREGATE_BUCKETS_S: tuple[float, ...] = log_bounds(1e-4, 1000.0)

#: Upper bounds of Prometheus' duration histograms, seconds: every second aggregate
#: bound from 1 ms to 100 s (101 bounds, 20 a decade).
PROMETHEUS_BUCKETS_S: tuple[float, ...] = log_bounds(1e-3, 100.0, PER_DECADE // 2)
