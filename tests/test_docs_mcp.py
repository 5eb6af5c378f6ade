"""The MCP client configurations on docs/mcp.md work as written: started the way an MCP
client starts a server (its own environment only, never the caller's shell), each one
reaches the fleet, because it carries the Redis URL itself."""

from __future__ import annotations

import json
import os
from typing import Any

import anyio
import pytest
from doc_blocks import ROOT, blocks
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from conftest import Fleet, toolfleet_command

PAGE = ROOT / "docs" / "mcp.md"
DOC_URL = "redis://127.0.0.1:6379/0"


def _configurations() -> list[dict[str, Any]]:
    found = []
    for block in blocks(PAGE):
        if block.lang == "json" and "mcpServers" in block.body:
            found += json.loads(block.body)["mcpServers"].values()
    return found


def _as_started_by_a_client(server: dict[str, Any], fleet: Fleet) -> StdioServerParameters:
    """The page's server entry pointed at the test's fleet: its Redis URL for the page's, and
    its key namespace added (the page's fleet uses the default one)."""
    args = [fleet.redis_url if a == DOC_URL else a for a in server["args"]]
    env = {k: fleet.redis_url if v == DOC_URL else v for k, v in server.get("env", {}).items()}
    if "TOOLFLEET_NAMESPACE" in env:
        env["TOOLFLEET_NAMESPACE"] = fleet.namespace
    else:
        args += ["--namespace", fleet.namespace]
    # env=None would still be the SDK's short default list: PATH, HOME, ... never TOOLFLEET_*
    return StdioServerParameters(command=toolfleet_command(), args=args, env=env or None)


async def _tool_names(params: StdioServerParameters) -> set[str]:
    with anyio.fail_after(60):
        async with Client(params) as client:
            return {tool.name for tool in (await client.list_tools()).tools}


def test_the_page_shows_both_ways_of_passing_the_url() -> None:
    """One configuration passes ``--redis-url``, one the client's ``env``."""
    servers = _configurations()
    assert any("--redis-url" in s["args"] for s in servers)
    assert any("TOOLFLEET_REDIS_URL" in s.get("env", {}) for s in servers)
    assert all(s["args"][:2] == ["mcp", "serve"] for s in servers)


@pytest.mark.parametrize("index", range(len(_configurations())))
def test_each_configuration_reaches_the_fleet(fleet: Fleet, index: int) -> None:
    """Started with only the client's environment, the gateway lists the fleet's tools."""
    params = _as_started_by_a_client(_configurations()[index], fleet)
    assert "ext_bfcl_math_gcd" in anyio.run(_tool_names, params)


def test_without_the_url_the_shells_variable_does_not_reach_the_gateway(fleet: Fleet) -> None:
    """What the page warns of: a URL only in the caller's environment is not passed on."""
    server = dict(_configurations()[0])
    server["args"] = [a for a in server["args"] if a not in ("--redis-url", DOC_URL)]
    params = _as_started_by_a_client(server, fleet)
    os.environ["TOOLFLEET_REDIS_URL"] = fleet.redis_url  # set in "the shell", as users do
    try:
        with pytest.raises(Exception):  # noqa: B017 - the session ends, whatever the SDK raises
            anyio.run(_tool_names, params)
    finally:
        del os.environ["TOOLFLEET_REDIS_URL"]
