"""The quality report: how well each model uses each tool, from the per-minute aggregates.

One row per function x model over a time range (:func:`quality_rows`), worst first: the
share of calls answered with each status, the failing argument fields with their
reason, and wait and run-time percentiles. ``toolfleet quality`` prints it; the ops
page shows the same rows.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from toolfleet.shared.aggregates import Cell, Window

__all__ = ["FailingField", "QualityRow", "parse_duration", "quality_rows"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: a number with an optional unit ``s``, ``m``, ``h`` or ``d`` (``1h``).

    Raises:
        ValueError: not such a duration.
    """
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 15m, 1h, 2d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


class FailingField(BaseModel):
    """An argument that failed validation: ``field`` (dotted path), ``reason``, ``calls``."""

    field: str
    reason: str
    calls: int


class QualityRow(BaseModel):
    """What one model did with one tool over the report's range.

    Attributes:
        function: the function label (a served name, or ``unknown``).
        model: the model label (an allowed name, ``other`` or ``none``).
        calls: calls answered.
        failed: calls answered with a status other than ``ok``.
        statuses: status -> calls.
        rates: status -> share of ``calls``, 0 to 1 (rounded to 4 digits).
        failing_fields: the most frequent failing arguments, most first.
        wait_p50_s, wait_p95_s: queue-wait percentiles, seconds (``None``: not measured).
        run_p50_s, run_p95_s: run-time percentiles, seconds.
    """

    function: str
    model: str
    calls: int
    failed: int
    statuses: dict[str, int]
    rates: dict[str, float]
    failing_fields: list[FailingField]
    wait_p50_s: float | None
    wait_p95_s: float | None
    run_p50_s: float | None
    run_p95_s: float | None


def _row(cell: Cell, top_fields: int) -> QualityRow:
    calls = cell.calls
    return QualityRow(
        function=cell.function,
        model=cell.model,
        calls=calls,
        failed=cell.failed,
        statuses=dict(sorted(cell.statuses.items())),
        rates={s: round(n / calls, 4) for s, n in sorted(cell.statuses.items())} if calls else {},
        failing_fields=[
            FailingField(field=f, reason=r, calls=n) for f, r, n in cell.top_fields(top_fields)
        ],
        wait_p50_s=_rounded(cell.wait.quantile(0.5)),
        wait_p95_s=_rounded(cell.wait.quantile(0.95)),
        run_p50_s=_rounded(cell.run.quantile(0.5)),
        run_p95_s=_rounded(cell.run.quantile(0.95)),
    )


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 6)


def quality_rows(
    window: Window,
    *,
    model: str | None = None,
    function: str | None = None,
    top_fields: int = 5,
) -> list[QualityRow]:
    """The report's rows: one per function x model, worst first (:meth:`Window.totals`).

    Args:
        window: what :func:`toolfleet.shared.aggregates.read_window` read.
        model: only this model label.
        function: only this function.
        top_fields: failing fields listed per row.
    """
    cells = window.totals(model=model, function=function)
    return [_row(cell, top_fields) for cell in cells if cell.calls]
