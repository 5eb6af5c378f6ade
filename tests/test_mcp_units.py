"""MCP extension rules that need no fleet: manifest keys, names, result shapes, idempotent hints."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from toolfleet.shared.errors import ConfigurationError, ExtensionToolError
from toolfleet.shared.extension import Extension
from toolfleet.shared.manifest import SettingSpec, read_manifest
from toolfleet.shared.mcp_config import McpServerConfig, expand_settings
from toolfleet.shared.wire import Status, ToolCallRequest

types = pytest.importorskip("mcp_types", reason="the MCP SDK (toolfleet[mcp]) is not installed")

from toolfleet.worker.mcp.tools import local_names, result_value  # noqa: E402
from toolfleet.worker.pipeline.calls import CallPipeline  # noqa: E402
from toolfleet.worker.registry.registry import Registry  # noqa: E402

PROBE = Path(__file__).resolve().parent / "mcp_servers" / "probe_server.py"


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "extension.toml"
    path.write_text('slug = "x"\nversion = "1"\n' + body, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ('entry = "m:a"\n[mcp]\ncommand = "s"\n', "not both"),
        ('[mcp]\ncommand = "s"\nurl = "http://h/mcp"\n', "either command"),
        ("[mcp]\nargs = []\n", "either command"),
        ('[mcp]\nurl = "ftp://h/mcp"\n', "http:// or https://"),
        ('[mcp]\nurl = "http://h/mcp"\nargs = ["a"]\n', "belong to a stdio server"),
        ('[mcp]\ncommand = "s"\nheaders = { A = "b" }\n', "belong to a Streamable HTTP"),
        ('isolation = "process"\n[mcp]\ncommand = "s"\n', "does not apply"),
        ('[mcp]\ncommand = "s"\nargs = ["{settings.nope}"]\n', "undeclared settings ['nope']"),
        (
            '[mcp]\ncommand = "s"\nargs = ["--key={settings.k}"]\n'
            '[[settings]]\nname = "k"\nsecret = true\n',
            "pass secrets to the server in env",
        ),
    ],
)
def test_bad_mcp_tables_are_manifest_errors(tmp_path: Path, body: str, problem: str) -> None:
    """Contradictory or incomplete [mcp] tables are refused with a message saying why."""
    with pytest.raises(ConfigurationError, match="invalid manifest") as caught:
        read_manifest(_write(tmp_path, body))
    assert problem in str(caught.value)


def test_a_plain_setting_in_args_and_a_secret_in_env_are_accepted(tmp_path: Path) -> None:
    """Only secret settings are kept out of args; env may carry them."""
    body = (
        '[mcp]\ncommand = "s"\nargs = ["{settings.zone}"]\nenv = { K = "{settings.k}" }\n'
        '[[settings]]\nname = "k"\nsecret = true\n[[settings]]\nname = "zone"\n'
    )
    assert read_manifest(_write(tmp_path, body)).mcp is not None


def test_an_mcp_extension_built_in_python_with_a_secret_in_args_is_not_started(
    tmp_path: Path,
) -> None:
    """An Extension object (no manifest check) whose MCP args name a secret setting is skipped
    and reported with a message pointing to env, and its server never starts."""
    marks = tmp_path / "marks-{settings.k}"  # the server would make this folder
    config = McpServerConfig(command=sys.executable, args=[str(PROBE), "--marks", str(marks)])
    extension = Extension(
        slug="argsecret",
        version="1",
        mcp=config,
        settings=[SettingSpec(name="k", secret=True, default="sk-in-argv-0123")],
    )
    registry = Registry(f"argsecret-{uuid.uuid4().hex[:6]}")
    registry.add_extensions([("python:argsecret", extension)])
    try:
        assert "in env" in registry.errors["python:argsecret"]
        assert "sk-in-argv-0123" not in registry.errors["python:argsecret"]
        assert not registry.served and not list(tmp_path.glob("marks-*"))
    finally:
        registry.close()


def test_settings_placeholders_expand_and_braces_escape() -> None:
    """{settings.<name>} takes the setting's value; {{ and }} are literal braces."""
    text = 'Bearer {settings.key} {{"raw": "{settings.n}"}}'
    assert expand_settings(text, {"key": "abc", "n": 3}) == 'Bearer abc {"raw": "3"}'
    assert expand_settings("$HOME ~ {other}", {}) == "$HOME ~ {other}"


def test_mcp_names_become_unique_function_parts() -> None:
    """MCP names with '-', '.', '/' become identifiers; names that meet get a hash suffix
    (the one sorting first keeps the plain name), and overlong ones are cut with a hash."""
    long = "n" * 80
    names = local_names(["a.b", "a-b", "a_b", "get/time", long])
    assert names["a-b"] == "a_b"  # '-' sorts before '.' and '_'
    assert names["a.b"].startswith("a_b_") and len(names["a.b"]) == len("a_b_") + 8
    assert names["a_b"].startswith("a_b_") and names["a_b"] != names["a.b"]
    assert names["get/time"] == "get_time"
    assert len(names[long]) == 64
    assert local_names(["a.b", "a-b", "a_b"]) == {k: names[k] for k in ("a.b", "a-b", "a_b")}


def test_result_blocks_map_to_the_documented_json() -> None:
    """Text, audio, resource links and embedded text/blob resources map to their shapes."""
    result = types.CallToolResult(
        content=[
            types.TextContent(text="hello"),
            types.AudioContent(data="UklGRg==", mime_type="audio/wav"),
            types.ResourceLink(uri="file:///r.txt", name="r", mime_type="text/plain"),
            types.EmbeddedResource(
                resource=types.TextResourceContents(uri="mem://a", mime_type="text/plain", text="t")
            ),
            types.EmbeddedResource(resource=types.BlobResourceContents(uri="mem://b", blob="AA==")),
        ]
    )
    assert result_value(result) == [
        {"type": "text", "text": "hello"},
        {"type": "audio", "mime_type": "audio/wav", "data": "UklGRg=="},
        {"type": "resource_link", "uri": "file:///r.txt", "name": "r", "mime_type": "text/plain"},
        {"type": "resource", "uri": "mem://a", "mime_type": "text/plain", "text": "t"},
        {"type": "resource", "uri": "mem://b", "data": "AA=="},
    ]
    assert result_value(types.CallToolResult(content=[types.TextContent(text="x")])) == "x"
    assert result_value(types.CallToolResult(content=[])) == []
    structured = types.CallToolResult(
        content=[types.TextContent(text="{}")], structured_content={"a": 1}
    )
    assert result_value(structured) == {"a": 1}
    with pytest.raises(ExtensionToolError, match="no space left"):
        result_value(
            types.CallToolResult(content=[types.TextContent(text="no space left")], is_error=True)
        )


@pytest.mark.parametrize("trust", [False, True])
def test_idempotent_hint_counts_only_when_the_manifest_agrees(tmp_path: Path, trust: bool) -> None:
    """A tool annotated idempotentHint is served idempotent only with trust_idempotent_hint;
    tools without the hint never are."""
    config = McpServerConfig(
        command=sys.executable,
        args=[str(PROBE), "--marks", str(tmp_path)],
        trust_idempotent_hint=trust,
    )
    registry = Registry()
    pipeline = CallPipeline(registry, worker_id="test")
    try:
        registry.add_extension(Extension(slug="hinted", version="1", mcp=config))
        assert registry.served["ext_hinted_echo"].idempotent is trust
        assert registry.served["ext_hinted_slow"].idempotent is False
        entry = registry.served["ext_hinted_echo"].catalog_entry().model_dump(mode="json")
        assert entry["annotations"] == {"readOnlyHint": True, "idempotentHint": True}
        request = ToolCallRequest(
            id=str(uuid.uuid4()),
            function="ext_hinted_echo",
            arguments={"text": "hi"},
            reply_to="unused",
            deadline=time.time() + 20,
            timeout_s=20,
        )
        assert pipeline.call(request).status is Status.OK
    finally:
        registry.close()
        pipeline.close()


@pytest.mark.parametrize(
    ("asked", "budget"),
    [(5, 5.0), (10**400, 60.0), (-(10**400), 10.0), (float("nan"), 10.0), (0, 10.0)],
    ids=["in-range", "int-too-large-for-a-float", "-int-too-large", "nan", "zero"],
)
def test_the_gateway_keeps_a_requested_timeout_within_its_bounds(
    redis_url: str, asked: Any, budget: float
) -> None:
    """A request's ``toolfleet/timeout_s`` is capped at ``max_timeout_s``, even an integer
    too large for a float (no ``OverflowError``); a non-positive or NaN one takes the default."""
    from toolfleet.producer import AsyncToolClient
    from toolfleet.producer.mcp import TIMEOUT_META_KEY
    from toolfleet.producer.mcp.gateway import Gateway, GatewayConfig

    async def scenario() -> float:
        async with AsyncToolClient(redis_url, namespace=f"tfgw-{uuid.uuid4().hex[:6]}") as client:
            gateway = Gateway(client, GatewayConfig(default_timeout_s=10, max_timeout_s=60))
            return gateway._timeout_s({TIMEOUT_META_KEY: asked})

    assert asyncio.run(scenario()) == budget


def test_session_call_ids_are_stable_uuids_distinct_per_account_session_and_request() -> None:
    """A handshake-era HTTP request's derived call id is a canonical UUID, the same on every
    replica, and differs for another account, session or request id (1 and "1" differ)."""
    from toolfleet.producer.mcp.sessions import session_call_id

    first = session_call_id("acme", "s1", 1)
    assert str(uuid.UUID(first)) == first
    assert session_call_id("acme", "s1", 1) == first
    others = [
        session_call_id("other", "s1", 1),
        session_call_id(None, "s1", 1),
        session_call_id("acme", "s2", 1),
        session_call_id("acme", "s1", 2),
        session_call_id("acme", "s1", "1"),
    ]
    assert len({first, *others}) == 1 + len(others)
