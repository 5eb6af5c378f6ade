"""An MCP server's tools as toolfleet tool specs, and MCP results as the JSON the model reads.

Names: each MCP tool name becomes a tool name with every character outside
``[a-zA-Z0-9_]`` turned into ``_`` (MCP names may hold ``-``, ``.`` and ``/``), so the
function is ``ext_<slug>_<tool>``. When two MCP names give the same tool name, the one
that sorts first keeps it and the others get ``_<8 hex digits of sha256(mcp name)>``;
a call always goes back to the original MCP name.

Results (:func:`result_value`):

- ``isError: true`` → ``tool_error`` with the server's text (its text blocks joined).
- ``structuredContent`` present → that JSON value.
- otherwise one text block → its text (a string); anything else → a list of blocks:
  ``{"type": "text", "text"}``, ``{"type": "image" | "audio", "mime_type", "data"}``
  (``data`` base64, as the server sent it), ``{"type": "resource_link", "uri", "name",
  "mime_type"?, "description"?}``, ``{"type": "resource", "uri", "mime_type"?, "text"}``
  or ``{..., "data"}`` (a base64 blob). No content → ``[]``.

The worker's ``max_result_bytes`` caps the encoded value like any tool's result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any

import mcp_types as types
from pydantic import BaseModel

from toolfleet.shared.errors import ExtensionToolError
from toolfleet.shared.naming import MAX_FUNCTION_NAME, sanitize_slug
from toolfleet.shared.schema import model_from_schema
from toolfleet.shared.spec import ToolSpec

__all__ = ["CallTool", "local_names", "result_value", "tool_specs"]

#: ``call(mcp_name, arguments, context)`` → the value the model reads.
CallTool = Callable[[str, dict[str, Any], Any], Awaitable[Any]]

#: Longest error text of an ``isError`` result passed to the model, characters.
MAX_ERROR_TEXT = 4000


def local_names(mcp_names: list[str]) -> dict[str, str]:
    """Map each MCP tool name to a unique toolfleet tool name (rules in the module docstring)."""
    taken: set[str] = set()
    names: dict[str, str] = {}
    for original in sorted(set(mcp_names)):
        name = sanitize_slug(original) or "tool"
        if name in taken or len(name) > MAX_FUNCTION_NAME:
            digest = hashlib.sha256(original.encode()).hexdigest()[:8]
            name = f"{name[: MAX_FUNCTION_NAME - 9]}_{digest}"
        taken.add(name)
        names[original] = name
    return names


def tool_specs(
    slug: str, tools: list[types.Tool], call: CallTool, *, trust_idempotent_hint: bool = False
) -> tuple[list[ToolSpec], list[str]]:
    """Specs for ``tools`` as listed by the server.

    Args:
        slug: the extension's slug (names the argument models).
        tools: the server's ``tools/list`` result, all pages.
        call: runs one call on the server (see :data:`CallTool`).
        trust_idempotent_hint: serve ``idempotentHint: true`` tools as idempotent.

    Returns:
        ``(specs, problems)``: a tool whose ``inputSchema`` cannot become an argument
        model is left out and named in ``problems``; the others are served.
    """
    names = local_names([t.name for t in tools])
    specs: list[ToolSpec] = []
    problems: list[str] = []
    for tool in tools:
        local = names[tool.name]
        try:
            model = model_from_schema(tool.input_schema, f"{sanitize_slug(slug)}_{local}_arguments")
        except Exception as exc:  # noqa: BLE001 - one bad schema skips one tool
            problems.append(f"MCP tool {tool.name!r}: bad inputSchema: {exc}")
            continue
        annotations = (
            tool.annotations.model_dump(by_alias=True, exclude_none=True, mode="json")
            if tool.annotations is not None
            else None
        )
        idempotent = bool(trust_idempotent_hint and (annotations or {}).get("idempotentHint"))
        specs.append(
            ToolSpec(
                name=local,
                description=tool.description or tool.title or tool.name,
                parameters=dict(tool.input_schema),
                arguments_model=model,
                invoke=_invoker(call, tool.name),
                is_async=True,
                display_name=tool.title or (annotations or {}).get("title"),
                kind="mcp",
                idempotent=idempotent,
                annotations=annotations or None,
                output_schema=tool.output_schema,
            )
        )
    return specs, problems


def _invoker(call: CallTool, mcp_name: str) -> Callable[[BaseModel, Any], Awaitable[Any]]:
    def invoke(arguments: BaseModel, context: Any) -> Awaitable[Any]:
        dumped = arguments.model_dump(mode="json", by_alias=True, exclude_unset=True)
        return call(mcp_name, dumped, context)

    return invoke


def result_value(result: types.CallToolResult) -> Any:
    """The JSON value the model reads for ``result`` (rules in the module docstring).

    Raises:
        ExtensionToolError: ``result.is_error``; the message is the server's text.
    """
    if result.is_error:
        text = "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))
        raise ExtensionToolError(
            text[:MAX_ERROR_TEXT] or "the MCP tool reported an error without a message"
        )
    if result.structured_content is not None:
        return result.structured_content
    blocks = [block_json(block) for block in result.content]
    if len(blocks) == 1 and blocks[0]["type"] == "text":
        return blocks[0]["text"]
    return blocks


def block_json(block: Any) -> dict[str, Any]:
    """One MCP content block in its documented JSON shape."""
    if isinstance(block, types.TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, types.ImageContent | types.AudioContent):
        return {"type": block.type, "mime_type": block.mime_type, "data": block.data}
    if isinstance(block, types.ResourceLink):
        link: dict[str, Any] = {"type": "resource_link", "uri": str(block.uri), "name": block.name}
        if block.mime_type:
            link["mime_type"] = block.mime_type
        if block.description:
            link["description"] = block.description
        return link
    if isinstance(block, types.EmbeddedResource):
        contents = block.resource
        shape: dict[str, Any] = {"type": "resource", "uri": str(contents.uri)}
        if contents.mime_type:
            shape["mime_type"] = contents.mime_type
        if isinstance(contents, types.TextResourceContents):
            shape["text"] = contents.text
        else:
            shape["data"] = contents.blob
        return shape
    dumped = block.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped if isinstance(dumped, dict) and "type" in dumped else {"type": "unknown"}
