"""Tool listing: which catalogued functions a model is shown, in its API's format."""

from __future__ import annotations

from typing import Any

from toolfleet.producer._core.observe import present
from toolfleet.producer.catalog import Catalog
from toolfleet.shared.export import export_tools

__all__ = ["tool_list"]


def tool_list(
    catalog: Catalog,
    account: str | None,
    format: str,
    include_unavailable: bool,  # noqa: A002
    metadata: bool = False,
) -> list[dict[str, Any]]:
    """The catalog's tools for ``account`` as a ``format`` tool list; fires ``tool_presented``.

    ``metadata``: each tool carries its schema hash (:func:`export_tools`).

    Raises:
        ValueError: unknown format.
    """
    entries = [
        e
        for name, e in sorted(catalog.entries.items())
        if include_unavailable or not catalog.refusal(name, account)
    ]
    tools = export_tools(entries, format, metadata=metadata)
    present([str(e.get("name")) for e in entries], account, format)
    return tools
