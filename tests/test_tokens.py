"""One rule for stored tokens: files hold SHA-256 digests; a presented token is looked up
by its digest, and the ops page and the MCP gateway both follow it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from toolfleet.producer.mcp import StaticTokenVerifier
from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.text import as_text
from toolfleet.shared.tokens import find_by_token, is_digest, token_digest
from toolfleet.ui.auth import Role, Sessions, TokenEntry

# sha256("test"), from any SHA-256 table (e.g. `printf test | sha256sum`).
TEST_DIGEST = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
E_ACUTE_DIGEST = "4a99557e4033c3539de2eb65472017cad5f9557f7a0625a09f1c3f6e2ba69c4c"


def test_digest_is_the_hex_sha256_of_the_utf8_token() -> None:
    assert token_digest("test") == TEST_DIGEST
    # "é" hashes as its two UTF-8 bytes c3 a9: `printf '\xc3\xa9' | sha256sum`.
    assert token_digest("é") == E_ACUTE_DIGEST


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (TEST_DIGEST, True),
        (TEST_DIGEST.upper(), False),
        (TEST_DIGEST[:-1], False),
        (TEST_DIGEST[:-1] + "g", False),
        ("", False),
    ],
)
def test_is_digest(value: str, expected: bool) -> None:
    assert is_digest(value) is expected


def test_find_by_token_answers_the_entry_of_that_token_only() -> None:
    table = {TEST_DIGEST: "alice", "0" * 64: "nobody"}
    assert find_by_token(table, "test") == "alice"
    assert find_by_token(table, "tes") is None
    assert find_by_token(table, TEST_DIGEST) is None  # the digest itself is not a token
    assert find_by_token({}, "test") is None


def test_the_ops_page_and_the_gateway_accept_the_same_token_for_the_same_digest(
    tmp_path: Path,
) -> None:
    sessions = Sessions((TokenEntry(sha256=TEST_DIGEST.upper(), role=Role.OPERATOR),))
    assert sessions.role_of_token("test") is Role.OPERATOR
    assert sessions.role_of_token("Test") is None

    tokens = tmp_path / "tokens.toml"
    tokens.write_text(f'[[tokens]]\nsha256 = "{TEST_DIGEST}"\naccount = "acme"\n')
    verifier = StaticTokenVerifier.from_file(tokens)
    granted = asyncio.run(verifier.verify_token("test"))
    assert granted is not None and granted.claims == {"account": "acme"}
    assert granted.token == ""  # the secret is not kept
    assert asyncio.run(verifier.verify_token("Test")) is None


def test_the_gateway_refuses_a_digest_that_is_not_one() -> None:
    with pytest.raises(ConfigurationError, match="not a hex SHA-256 digest"):
        StaticTokenVerifier({"test": ("acme", None)})


def test_as_text() -> None:
    assert as_text(b"caf\xc3\xa9") == "café"
    assert as_text("already") == "already"
    assert as_text(3) == "3"
    with pytest.raises(UnicodeDecodeError):
        as_text(b"\xff")
