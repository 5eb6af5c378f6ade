"""What ``toolfleet demo`` prints: its replay, quality and unknown names, one line a fact.

Every row is one line at 80 columns for the bundled sample: names lose the prefix they
all share (said once, in the title), each figure says what it means beside it, and a
cell too long for a narrower terminal is cut with an ellipsis, never wrapped.
"""

from __future__ import annotations

import os
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence

from rich.console import Group
from rich.table import Column, Table
from rich.text import Text

from toolfleet.shared.metric_labels import UNKNOWN_FUNCTION_LABEL
from toolfleet.shared.quality import QualityRow
from toolfleet.worker.devtools.replay import ReplayReport

__all__ = [
    "NEXT_STEP",
    "host_notices",
    "mismatch_lines",
    "quality_part",
    "replay_table",
    "unknown_table",
]

#: The demo's last line: what to try next.
NEXT_STEP = "Next: `toolfleet new my-tools` writes an extension of your own, with a test."

#: What each status the replay counts means, in a few words.
STATUS_MEANING = {
    "ok": "the tool ran and returned its result",
    "tool_error": "the tool refused; the model reads its message",
    "invalid_arguments": "refused before running; the model reads why",
    "unknown_function": "no such tool; the producer answered at once",
    "not_available": "no live worker serves the tool now",
    "timeout": "the tool ran past its time limit",
    "expired": "the deadline passed before the call ran",
    "crashed": "the worker process died during the call",
    "canceled": "the caller canceled the call",
    "rejected": "the request could not be read",
}


def _table(*columns: Column) -> Table:
    """A borderless table whose cells never wrap (cut with an ellipsis instead)."""
    for column in columns:
        column.no_wrap = True
        column.overflow = "ellipsis"
    return Table(
        *columns, box=None, pad_edge=False, header_style="bold",
        show_header=any(c.header for c in columns),
    )  # fmt: skip


def _titled(title: str, table: Table) -> Group:
    """``table`` under a one-line title (a table's own title wraps to the table's width)."""
    return Group(Text(title, style="bold", no_wrap=True, overflow="ellipsis"), table)


def replay_table(report: ReplayReport, files: Sequence[str]) -> Group:
    """The replay's figures and statuses, each with what it means, in one table.

    Args:
        report: the replay's outcome.
        files: the names of the files replayed (for the title).
    """
    source = files[0] if len(files) == 1 else f"{len(files)} files"
    entries = f" ({report.entries} entries)" if report.entries != report.calls else ""
    table = _table(Column("", justify="right"), Column(""), Column(""))
    rows = [
        (str(report.correct), "correct", "answered as the file expects: status and result"),
        (str(report.bit_exact), "bit-exact",
         f"of {report.compared} results checked: identical, not just ±1e-9"),
        (str(len(report.mismatches)), "mismatched", "answered otherwise than the file expects"),
        (f"{report.percentile_ms(50):.0f} ms", "p50", "half the calls were answered within this"),
        (f"{report.percentile_ms(99):.0f} ms", "p99",
         "99% within this (all sent at once: waits count)"),
    ]  # fmt: skip
    for row in rows:
        table.add_row(*row)
    for status, count in sorted(report.statuses.items(), key=lambda i: (-i[1], i[0])):
        table.add_row(str(count), status, STATUS_MEANING.get(status, ""))
    return _titled(f"{report.calls} calls replayed from {source}{entries}", table)


def mismatch_lines(report: ReplayReport, width: int, most: int = 10) -> list[str]:
    """One line per mismatch (at most ``most``, then how many more), cut to ``width``."""
    lines = [
        _cut(f"mismatch {case.source} {case.function}: {why}", width)
        for case, _result, why in report.mismatches[:most]
    ]
    if len(report.mismatches) > most:
        lines.append(f"... and {len(report.mismatches) - most} more mismatches")
    return lines


def _shared_prefix(names: Iterable[str]) -> str:
    """The ``_``-ended beginning every name shares (``ext_bfcl_``), or ``""``."""
    common = os.path.commonprefix(list(names))
    return common[: common.rfind("_") + 1] if "_" in common else ""


def _fields(row: QualityRow) -> str:
    return ", ".join(
        f"{f.field} {f.reason}" + (f" x{f.calls}" if f.calls > 1 else "")
        for f in row.failing_fields
    )


def quality_part(rows: list[QualityRow], width: int) -> tuple[Group, list[str]]:
    """The quality report's pairs with a call not ok, and lines naming the failing fields.

    Pairs whose calls were all ``ok`` are counted in the caption, not listed
    (``toolfleet quality`` lists every pair, with wait and run times). Names no tool has
    (the ``unknown`` rows of the producer's refusals) are left to :func:`unknown_table`.

    Returns:
        The table, and the failing-fields lines that follow it (wrapped to ``width``).
    """
    rows = [row for row in rows if row.function != UNKNOWN_FUNCTION_LABEL]
    failed = [row for row in rows if row.failed]
    prefix = _shared_prefix(row.function for row in failed) if len(failed) > 1 else ""
    fine = len(rows) - len(failed)
    title = "calls not ok, by tool and model (toolfleet quality), worst first"
    table = _table(
        Column(f"tool (after {prefix})" if prefix else "tool"), Column("model"),
        Column("not ok", justify="right"), Column("statuses"),
    )  # fmt: skip
    if fine:
        table.caption = f"and {fine} tool and model pairs with every call ok"
        table.caption_justify = "left"
    notes: list[str] = []
    for row in failed:
        name = row.function.removeprefix(prefix)
        statuses = ", ".join(
            f"{n} {s}" for s, n in sorted(row.statuses.items(), key=lambda i: -i[1]) if s != "ok"
        )
        table.add_row(name, row.model, f"{row.failed} of {row.calls}", statuses)
        if row.failing_fields:
            notes += textwrap.wrap(
                f"{name} by {row.model}, failing fields: {_fields(row)}",
                width, initial_indent="  ", subsequent_indent="    ",
            )  # fmt: skip
    return _titled(title, table), notes


def unknown_table(asked: Iterable[tuple[str, str, int]]) -> Group:
    """Names the producer answered ``unknown_function`` for: ``(model, name, calls)``."""
    table = _table(Column("model"), Column("asked for"), Column("calls", justify="right"))
    for model, name, calls in sorted(asked):
        table.add_row(model, name, str(calls))
    return _titled("unknown functions: names no tool has, answered by the producer", table)


_ABOUT = re.compile(r"^extension '(?P<slug>[^']+)': (?P<why>.*)$", re.DOTALL)


def host_notices(errors: Mapping[str, str]) -> list[str]:
    """One plain sentence per extension the workers did not serve on this host.

    Args:
        errors: extension source -> why, as the workers report them
            (:meth:`~toolfleet.producer.ToolClient.extension_errors`).
    """
    notices = []
    for source, why in sorted(errors.items()):
        found = _ABOUT.match(why)
        slug = found["slug"] if found else source
        reason = found["why"] if found else why
        if slug == "python" and "bubblewrap" in reason:
            if "not installed" in reason:
                notices.append(
                    "The python tool is not served: it needs bubblewrap "
                    "(apt-get install bubblewrap)."
                )
            else:
                notices.append(
                    "The python tool is not served: its sandbox (bubblewrap) cannot start here."
                )
            continue
        first = re.split(r"[;\n]", reason, maxsplit=1)[0].strip().rstrip(".")
        notices.append(f"The extension {slug} is not served: {first}.")
    return notices


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(1, width - 1)] + "…"
