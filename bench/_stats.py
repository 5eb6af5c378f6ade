"""Percentiles and medians of the benchmark's samples (no third-party imports)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Iterable[float | None]) -> float:
    """Median of the numbers given (``None`` and NaN skipped); NaN when none."""
    clean = [v for v in values if v is not None and v == v]
    return statistics.median(clean) if clean else float("nan")
