"""The tables of a ``toolfleet top`` frame, and how many rows of each fit a terminal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from rich.console import Console, ConsoleOptions
from rich.table import Column, Table

__all__ = ["Section", "fit_rows", "middle_cut"]


@dataclass
class Section:
    """One table of a frame: its rows in the order shown, each with a weight.

    When not every row fits, the heaviest are kept (in their order) and a caption says
    how many were left out.

    Attributes:
        title: the table's title.
        columns: header text of each column; the first (a name) is cut with an ellipsis
            rather than wrapped, so that every row is one line.
        rows: ``(weight, cells)`` in display order; cells are plain text.
        noun: what a row is, plural (``"functions"``): the caption reads ``+3 more
            functions``.
        empty: the caption when there are no rows (``None``: none).
    """

    title: str
    columns: Sequence[str]
    rows: list[tuple[float, list[str]]] = field(default_factory=list)
    noun: str = "rows"
    empty: str | None = None

    def table(self, keep: int | None = None) -> Table:
        """The rich table with at most ``keep`` rows (``None``: all), one line each."""
        shown = [cells for _, cells in self.rows] if keep is None else self._heaviest(keep)
        left_out = len(self.rows) - len(shown)
        caption = f"+{left_out} more {self.noun}" if left_out else None
        if not self.rows and self.empty:
            caption = self.empty
        first, *rest = self.columns
        table = Table(
            Column(first, no_wrap=True, overflow="ellipsis"),
            *(Column(name, no_wrap=True, overflow="ellipsis") for name in rest),
            title=self.title,
            caption=caption,
            caption_justify="left",
            box=None,  # columns two spaces apart: more room for names than rules
            pad_edge=False,
            header_style="bold",
        )
        for cells in shown:
            table.add_row(*cells)
        return table

    def _heaviest(self, keep: int) -> list[list[str]]:
        ranked = sorted(range(len(self.rows)), key=lambda i: -self.rows[i][0])[: max(0, keep)]
        return [self.rows[i][1] for i in sorted(ranked)]


def _lines(console: Console, options: ConsoleOptions, table: Table) -> int:
    return len(console.render_lines(table, options, pad=False))


def fit_rows(console: Console, sections: Sequence[Section], width: int, height: int) -> list[int]:
    """How many rows of each section to show so that all of them fit in ``height`` lines.

    Every section keeps its title, header and at least one row (when it has any); rows
    come off the longest table first, so that a long table cannot push the others off
    the screen. Sections that cannot fit even so are given one row each (the terminal
    then cuts the frame, as it would any text).

    Args:
        console: the console the frame is drawn on (for measuring).
        sections: the frame's tables, in order.
        width: columns of the terminal.
        height: lines the tables may use together.

    Returns:
        The number of rows to keep, per section.
    """
    options = console.options.update(width=width)
    bare = [_lines(console, options, s.table(0)) - (1 if s.rows else 0) for s in sections]
    keep = [len(s.rows) for s in sections]

    def used() -> int:
        total = 0
        for section, overhead, kept in zip(sections, bare, keep, strict=True):
            total += overhead + kept + (1 if kept < len(section.rows) else 0)
        return total

    while used() > height:
        longest = max(range(len(keep)), key=lambda i: keep[i])
        if keep[longest] <= 1:
            break
        keep[longest] -= 1
    return keep


def middle_cut(name: str, width: int) -> str:
    """``name`` in at most ``width`` characters: its start and end around an ellipsis.

    Function names share their beginnings (``ext_<slug>_``) and differ at their ends,
    which a cut at the end would lose.
    """
    if len(name) <= width:
        return name
    if width <= 1:
        return name[:width]
    tail = (width - 1) // 2
    return name[: width - 1 - tail] + "…" + name[len(name) - tail :]
