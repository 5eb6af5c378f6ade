"""``toolfleet tools --format display`` as text a person reads: one block per tool."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["display_text"]

#: Narrowest width the text is wrapped to, whatever the terminal says.
MIN_WIDTH = 40


def display_text(tools: Iterable[Mapping[str, Any]], width: int) -> str:
    """Tools of the ``display`` export (:func:`toolfleet.shared.export.export_tools`) as text.

    Each tool is its name (and display name when it has its own), its description, the
    display description and the preparation text when given, and one line per parameter:
    ``name (type, required|optional): description``. Every line fits in ``width``
    columns (at least :data:`MIN_WIDTH`); tools are separated by a blank line.

    Args:
        tools: ``display`` rows: ``name``, ``display_name``, ``description``,
            ``display_description``, ``preparation``, ``parameters`` (``name``, ``type``,
            ``description``, ``display_description``, ``required``).
        width: columns to wrap to.

    Returns:
        The text, ending with a newline; empty for no tools.
    """
    width = max(MIN_WIDTH, width)
    return "".join(_block(tool, width) + "\n" for tool in tools).removesuffix("\n")


def _block(tool: Mapping[str, Any], width: int) -> str:
    name = str(tool.get("name", ""))
    shown_name = str(tool.get("display_name") or name)
    lines = [name if shown_name == name else f"{name} ({shown_name})"]
    description = str(tool.get("description") or "")
    lines += _paragraphs(description, width, "  ")
    shown = str(tool.get("display_description") or "")
    if shown and shown != description:
        lines += _wrap(f"shown as: {shown}", width, "  ", "    ")
    if tool.get("preparation"):
        lines += _wrap(f"while preparing: {tool['preparation']}", width, "  ", "    ")
    parameters = list(tool.get("parameters") or ())
    lines.append("  parameters:" if parameters else "  parameters: none")
    for parameter in parameters:
        lines += _parameter(parameter, width)
    return "\n".join(lines) + "\n"


def _parameter(parameter: Mapping[str, Any], width: int) -> list[str]:
    kind = parameter.get("type") or "any type"
    needed = "required" if parameter.get("required") else "optional"
    head = f"{parameter.get('name', '')} ({kind}, {needed})"
    description = str(parameter.get("description") or "")
    lines = _wrap(f"{head}: {description}" if description else head, width, "    ", "      ")
    shown = str(parameter.get("display_description") or "")
    if shown and shown != description:
        lines += _wrap(f"shown as: {shown}", width, "      ", "        ")
    return lines


def _paragraphs(text: str, width: int, indent: str) -> list[str]:
    """``text`` wrapped paragraph by paragraph (blank lines kept between them)."""
    out: list[str] = []
    for paragraph in text.strip().split("\n\n"):
        if paragraph.strip():
            if out:
                out.append("")
            out += _wrap(" ".join(paragraph.split()), width, indent, indent)
    return out


def _wrap(text: str, width: int, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    ) or [first.rstrip()]
