"""Tool lists in the formats model APIs take, built from catalog entries."""

from __future__ import annotations

from typing import Any

__all__ = ["FORMATS", "export_tools"]

FORMATS = ("openai", "responses", "anthropic", "mcp")


def export_tools(entries: list[dict[str, Any]], fmt: str = "openai") -> list[dict[str, Any]]:
    """Render catalog entries as a tool list.

    Args:
        entries: catalog entries (``name``, ``description``, ``parameters``).
        fmt: ``openai`` (Chat Completions ``{"type": "function", "function": {...}}``),
            ``responses`` (OpenAI Responses, flat), ``anthropic`` (``input_schema``) or
            ``mcp`` (``inputSchema``).

    Raises:
        ValueError: unknown format.
    """
    out: list[dict[str, Any]] = []
    for e in entries:
        name, description, schema = e["name"], e.get("description", ""), e.get("parameters", {})
        if fmt == "openai":
            out.append(
                {
                    "type": "function",
                    "function": {"name": name, "description": description, "parameters": schema},
                }
            )
        elif fmt == "responses":
            out.append(
                {"type": "function", "name": name, "description": description, "parameters": schema}
            )
        elif fmt == "anthropic":
            out.append({"name": name, "description": description, "input_schema": schema})
        elif fmt == "mcp":
            out.append({"name": name, "description": description, "inputSchema": schema})
        else:
            raise ValueError(f"unknown tool format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return out
