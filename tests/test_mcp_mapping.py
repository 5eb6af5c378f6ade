"""The gateway's pure rules: toolfleet results as MCP results, tokens as accounts."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from toolfleet.producer.mcp import (
    STATUS_META_KEY,
    Caller,
    StaticTokenVerifier,
    call_tool_result,
    caller_of,
    token_digest,
)
from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.wire import Status, ToolCallResult

OLD, MODERN = "2025-06-18", "2026-07-28"


def _result(status: Status, content: object) -> ToolCallResult:
    return ToolCallResult(id="c1", function="ext_x_y", status=status, content=content)


def test_ok_object_is_text_and_structured_content() -> None:
    """ok with an object: its JSON as text and the object as structuredContent, not isError."""
    mapped = call_tool_result(_result(Status.OK, {"a": 1}), OLD)
    assert not mapped.is_error and mapped.structured_content == {"a": 1}
    assert [c.model_dump(exclude_none=True) for c in mapped.content] == [
        {"type": "text", "text": '{"a":1}'}
    ]
    assert mapped.meta == {STATUS_META_KEY: "ok"}


@pytest.mark.parametrize(("version", "structured"), [(OLD, None), (MODERN, [1, 2])])
def test_ok_non_object_is_structured_only_where_the_version_allows(
    version: str, structured: object
) -> None:
    """A list result is structuredContent only from 2026-07-28 (before, it must be an object)."""
    mapped = call_tool_result(_result(Status.OK, [1, 2]), version)
    assert mapped.structured_content == structured
    assert mapped.content[0].text == "[1,2]"  # type: ignore[union-attr]


def test_ok_string_is_its_own_text() -> None:
    """A string result reaches the model as itself, not as a quoted JSON string."""
    assert call_tool_result(_result(Status.OK, "hello"), OLD).content[0].text == "hello"  # type: ignore[union-attr]


@pytest.mark.parametrize("status", [s for s in Status if s is not Status.OK])
def test_every_error_status_is_is_error_with_the_error_json(status: Status) -> None:
    """Each non-ok status: isError, the {"error": ...} text, no structuredContent, the status."""
    mapped = call_tool_result(_result(status, {"error": "why"}), MODERN)
    assert mapped.is_error and mapped.structured_content is None
    assert mapped.content[0].text == '{"error":"why"}'  # type: ignore[union-attr]
    assert mapped.meta == {STATUS_META_KEY: status.value}


def test_static_verifier_maps_tokens_to_accounts(tmp_path: Path) -> None:
    """A tokens file of digests: a known token verifies to its account and user; an unknown
    one to None; the returned access token does not carry the secret."""
    path = tmp_path / "tokens.toml"
    path.write_text(
        f'[[tokens]]\nsha256 = "{token_digest("s3cret")}"\naccount = "acme"\nuser = "bot"\n'
    )
    verifier = StaticTokenVerifier.from_file(path)
    token = anyio.run(verifier.verify_token, "s3cret")
    assert token is not None and "s3cret" not in token.model_dump_json()
    assert caller_of(token, Caller(None)) == Caller("acme", "bot")
    assert anyio.run(verifier.verify_token, "s3cret ") is None
    assert caller_of(None, Caller("default")) == Caller("default")


@pytest.mark.parametrize(
    "text",
    ["[[tokens]]\naccount = 'a'\n", "[[tokens]]\nsha256 = 'abc'\naccount = 'a'\n", "not toml ["],
)
def test_bad_tokens_file_is_a_configuration_error(tmp_path: Path, text: str) -> None:
    """A tokens file without a digest, with a malformed digest, or not TOML is refused."""
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(ConfigurationError):
        StaticTokenVerifier.from_file(path)
