"""`toolfleet mcp serve` against the official MCP Inspector CLI (npm).

The Inspector (`@modelcontextprotocol/inspector`, run as `mcp-inspector --cli`) is
installed before the tests run (.ci/run's NPM_PACKAGES, into build/npm), never fetched
here. Skipped only where node itself is absent (and then failing in CI); node present
without the Inspector installed is a failure that says how to install it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_mcp_gateway import ACME_TOKEN, Replica, mcp_fleet, replicas, tokens_file

from conftest import TESTS, Fleet, toolfleet_command, unavailable

__all__ = ["mcp_fleet", "replicas", "tokens_file"]  # module fixtures shared with the SDK tests

pytestmark = pytest.mark.slow

INSTALL = "bash .ci/test-tools"


@pytest.fixture(scope="module")
def inspector() -> Iterator[list[str]]:
    """The Inspector CLI command (`mcp-inspector --cli`)."""
    if shutil.which("node") is None:
        unavailable("node is not installed: the MCP Inspector CLI test needs it")
    folder = os.environ.get("TOOLFLEET_TEST_NPM_BIN") or str(
        TESTS.parent / "build" / "npm" / "node_modules" / ".bin"
    )
    binary = Path(folder) / "mcp-inspector"
    if not binary.exists():
        pytest.fail(f"{binary} is missing: install it first ({INSTALL}, or run .ci/run)")
    yield [str(binary), "--cli"]


def run(command: list[str], *args: str) -> tuple[int, object]:
    """Run the Inspector CLI once; its exit code and the JSON it printed."""
    out = subprocess.run(
        [*command, *args], capture_output=True, text=True, timeout=120, check=False
    )
    try:
        return out.returncode, json.loads(out.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"no JSON from the Inspector:\n{out.stdout}\n{out.stderr}") from None


def test_inspector_over_http_lists_calls_and_sees_errors(
    inspector: list[str], replicas: list[Replica]
) -> None:
    """The Inspector, with a bearer token, lists the account's tools, calls one, and reads a
    tool error as isError (its exit code for a tool error is non-zero)."""
    target = [replicas[0].url, "--header", f"Authorization: Bearer {ACME_TOKEN}"]
    code, listed = run(inspector, *target, "--method", "tools/list")
    assert code == 0
    names = {tool["name"] for tool in listed["tools"]}  # type: ignore[index]
    assert {"ext_fleet_test_add", "ext_guarded_mode"} <= names
    call = ["--method", "tools/call", "--tool-name", "ext_fleet_test_add"]
    code, added = run(inspector, *target, *call, "--tool-arg", "a=40", "--tool-arg", "b=2")
    assert code == 0 and added["isError"] is False  # type: ignore[index]
    assert added["content"] == [{"type": "text", "text": "42"}]  # type: ignore[index]
    fail = ["--method", "tools/call", "--tool-name", "ext_fleet_test_fail"]
    code, failed = run(inspector, *target, *fail, "--tool-arg", "reason=no such city")
    assert code != 0 and failed["isError"] is True  # type: ignore[index]
    assert json.loads(failed["content"][0]["text"]) == {"error": "no such city"}  # type: ignore[index]


def test_inspector_without_a_token_is_refused(
    inspector: list[str], replicas: list[Replica]
) -> None:
    """Without a bearer token the Inspector cannot list tools (the gateway answers 401)."""
    out = subprocess.run(
        [*inspector, replicas[0].url, "--method", "tools/list"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode != 0
    assert "ext_fleet_test_add" not in out.stdout


def test_inspector_over_stdio_lists_and_calls(inspector: list[str], mcp_fleet: Fleet) -> None:
    """The Inspector starts `toolfleet mcp serve` itself over stdio (passing it only the
    environment it is told to), lists the tools and calls one as the --account."""
    server = [
        *("-e", f"TOOLFLEET_REDIS_URL={mcp_fleet.redis_url}"),
        *("-e", f"TOOLFLEET_NAMESPACE={mcp_fleet.namespace}"),
        *("--", toolfleet_command(), "mcp", "serve", "--account", "acme"),
    ]
    code, listed = run(inspector, "--method", "tools/list", *server)
    assert code == 0
    assert "ext_guarded_mode" in {t["name"] for t in listed["tools"]}  # type: ignore[index]
    call = ["--method", "tools/call", "--tool-name", "ext_guarded_mode"]
    code, result = run(inspector, *call, *server)
    assert code == 0 and result["isError"] is False  # type: ignore[index]
    assert json.loads(result["content"][0]["text"])["account"] == "acme"  # type: ignore[index]
