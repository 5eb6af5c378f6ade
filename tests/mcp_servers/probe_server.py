"""An MCP server built with the official SDK, for what the reference servers cannot show.

Run as ``python probe_server.py --marks DIR [--http PORT] [--mode normal|hang|crash]``.
``--marks`` is a folder where the server leaves evidence the tests read: ``cancelled-<n>``
when a ``slow`` call was cancelled, ``pid-<pid>`` at start. ``tools/list`` is served two
tools per page, so the client must follow ``nextCursor``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ListToolsResult, PaginatedRequestParams, ToolAnnotations

PAGE = 2


class PagedServer(MCPServer):
    """MCPServer whose tools/list answers in pages of ``PAGE`` tools."""

    async def _handle_list_tools(  # type: ignore[override]
        self, ctx: Any, params: PaginatedRequestParams | None
    ) -> ListToolsResult:
        tools = await self.list_tools()
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + PAGE
        cursor = str(end) if end < len(tools) else None
        return ListToolsResult(tools=tools[start:end], next_cursor=cursor)


def build(marks: Path) -> MCPServer:
    server = PagedServer("probe")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
    def echo(text: str) -> str:
        """Return the text unchanged."""
        return text

    @server.tool(name="util.upper-case")
    def upper(text: str) -> str:
        """Upper-case the text (a tool whose MCP name has a dot and a hyphen)."""
        return text.upper()

    @server.tool()
    async def slow(seconds: float, label: str = "slow") -> str:
        """Sleep, then answer; leaves cancelled-<label> in the marks folder when cancelled."""
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            (marks / f"cancelled-{label}").write_text(str(time.time()))
            raise
        return "done"

    @server.tool()
    async def count(steps: int, ctx: Context) -> str:
        """Report progress once per step, 0.3 s apart."""
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps, f"step {step}")
            await anyio.sleep(0.3)
        return f"counted {steps}"

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    def hold(seconds: float) -> str:
        """Block a thread for ``seconds``: the server cannot exit on stdin EOF meanwhile."""
        time.sleep(seconds)
        return "held"

    @server.tool()
    def record(tag: str) -> str:
        """Leave called-<tag> in the marks folder (shows which calls reached the server)."""
        (marks / f"called-{tag}").write_text(str(time.time()))
        return tag

    @server.tool()
    def crash() -> str:
        """Exit the server process in the middle of the call."""
        os._exit(3)

    @server.tool()
    def fail(message: str) -> str:
        """Raise ToolError, which the SDK turns into an isError result with the message."""
        raise ToolError(message)

    @server.tool()
    def picture() -> Image:
        """A 1x1 PNG image."""
        return Image(data=bytes.fromhex("89504e470d0a1a0a"), format="png")

    @server.tool()
    def big(size: int) -> str:
        """A string of ``size`` characters."""
        return "x" * size

    @server.tool()
    def environment() -> dict[str, Any]:
        """The server process's environment and working directory."""
        return {"env": dict(os.environ), "cwd": os.getcwd()}

    @server.tool()
    async def add_tool(name: str, ctx: Context) -> str:
        """Add a tool called ``name`` and tell the client that the tool list changed."""

        def added() -> str:
            return f"{name} was added at run time"

        server.add_tool(added, name=name, description=f"Added at run time: {name}")
        await ctx.session.send_tool_list_changed()
        return "added"

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marks", type=Path, required=True)
    parser.add_argument("--http", type=int, default=0)
    parser.add_argument("--mode", default="normal", choices=["normal", "hang", "crash"])
    args = parser.parse_args()
    args.marks.mkdir(parents=True, exist_ok=True)
    (args.marks / f"pid-{os.getpid()}").write_text(" ".join(sys.argv))
    if args.mode == "crash":
        sys.exit(2)
    if args.mode == "hang":  # reads nothing, answers nothing
        time.sleep(3600)
    server = build(args.marks)
    if args.http:
        server.run("streamable-http", host="127.0.0.1", port=args.http)
    else:
        server.run()


if __name__ == "__main__":
    main()
