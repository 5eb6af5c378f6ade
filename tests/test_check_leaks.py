"""`toolfleet extensions check` and the extension loader: no secret in their output, error
text printed as text (never as rich markup), and a secret too short to redact refused."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from conftest import start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared import Status

#: The tools of a test-only folder extension (its manifest gives slug, version, settings).
SHORT_TOOLS = '''
from pydantic import BaseModel

from toolfleet.shared import Tool


class Nothing(BaseModel):
    pass


class Hello(Tool):
    """Say hello."""

    name = "hello"
    arguments_model = Nothing

    def call(self, arguments: Nothing, context: object) -> str:
        return "hello"


tools = [Hello]
'''


def _extension(folder: Path, slug: str, manifest: str, module: str | None = None) -> Path:
    """A folder extension ``slug`` under ``folder`` (with ``<slug>_tools.py`` if given)."""
    home = folder / slug.replace("[", "").replace("]", "").replace("/", "")
    home.mkdir(parents=True)
    (home / "extension.toml").write_text(manifest, encoding="utf-8")
    if module is not None:
        (home / f"{slug}_tools.py").write_text(module, encoding="utf-8")
    return home


def _secret_tool(folder: Path, slug: str) -> None:
    _extension(
        folder,
        slug,
        f'slug = "{slug}"\nversion = "1.0.0"\nentry = "{slug}_tools:tools"\n'
        '[[settings]]\nname = "token"\nsecret = true\n',
        SHORT_TOOLS,
    )


def _check(folder: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    return subprocess.run(
        [toolfleet_command(), "extensions", "check", "--no-entry-points", str(folder)],
        capture_output=True,
        text=True,
        env={**clean, "COLUMNS": "400", **env},
        timeout=120,
        check=False,
    )


def test_a_secret_in_an_mcp_servers_cwd_is_not_printed(tmp_path: Path) -> None:
    """An MCP server whose ``cwd`` holds a secret setting fails to start; the check reports
    the failure with the secret scrubbed, on stdout and in its log lines on stderr."""
    pytest.importorskip("mcp", reason="the MCP SDK (toolfleet[mcp]) is not installed")
    secret = f"cwd-secret-{uuid.uuid4().hex}"
    _extension(
        tmp_path,
        "cwdsecret",
        f'slug = "cwdsecret"\nversion = "1.0.0"\n[mcp]\ncommand = "{Path(sys.executable)}"\n'
        'cwd = "{settings.token}"\n[[settings]]\nname = "token"\nsecret = true\n',
    )
    out = _check(tmp_path, TOOLFLEET_EXT_CWDSECRET_TOKEN=secret)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert secret not in text and secret[4:-4] not in text, text
    (problem,) = [line for line in out.stdout.splitlines() if line.startswith("problem")]
    assert "cwdsecret" in problem and "MCP server not started" in problem, problem


def test_error_text_and_names_are_printed_as_text_not_markup(tmp_path: Path) -> None:
    """A slug, a version and an error message holding rich markup (``[/red]``, ``[bold]``)
    are printed as written, and the check still lists every extension."""
    _extension(
        tmp_path, "x[/red]y", 'slug = "x[/red]y"\nversion = "1.0.0"\nentry = "nothing:here"\n'
    )
    _extension(
        tmp_path,
        "marked",
        'slug = "marked"\nversion = "2.0[/red][bold]"\nentry = "marked_tools:tools"\n',
        SHORT_TOOLS,
    )
    out = _check(tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "Traceback" not in text, text
    assert "2.0[/red][bold]" in out.stdout, text
    (problem,) = [line for line in out.stdout.splitlines() if line.startswith("problem")]
    assert "x[/red]y" in problem, problem


def test_a_secret_too_short_to_redact_is_refused_at_load_in_one_line(tmp_path: Path) -> None:
    """A 3-character secret would match ordinary text, so it could not be scrubbed safely:
    the extension is refused with one line naming the setting (never the value), and the
    others load."""
    _secret_tool(tmp_path, "short")
    _secret_tool(tmp_path, "fine")
    out = _check(
        tmp_path,
        TOOLFLEET_EXT_SHORT_TOKEN="Q7z",
        TOOLFLEET_EXT_FINE_TOKEN=f"long-enough-{uuid.uuid4().hex}",
    )
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    (problem,) = [line for line in out.stdout.splitlines() if line.startswith("problem")]
    assert "'short'" in problem and "TOOLFLEET_EXT_SHORT_TOKEN" in problem, problem
    assert "too short" in problem, problem
    assert "Q7z" not in text, text
    assert "fine" in out.stdout and "1 extension(s) with problems" in out.stdout, text


def test_a_fleet_skips_an_extension_whose_secret_is_too_short_and_serves_the_others(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """The worker refuses the short-secret extension (reported in the catalog's extension
    errors) and serves the rest: the test extension and a sibling folder extension."""
    folder = tmp_path / "extensions"
    _secret_tool(folder, "short")
    _secret_tool(folder, "fine")
    fleet = start_fleet(
        redis_url,
        f"{namespace}-short-{uuid.uuid4().hex[:6]}",
        tmp_path / "worker.log",
        processes=1,
        env={
            "TOOLFLEET_EXTENSION_PATHS": str(folder),
            "TOOLFLEET_EXT_SHORT_TOKEN": "Q7z",
            "TOOLFLEET_EXT_FINE_TOKEN": f"long-enough-{uuid.uuid4().hex}",
        },
    )
    try:
        with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            assert client.call("ext_fine_hello", {}, timeout_s=30).content == "hello"
            assert client.call("ext_fleet_test_add", {"a": 1, "b": 2}, timeout_s=30).content == 3
            refused = client.call("ext_short_hello", {}, timeout_s=30)
            assert refused.status is Status.UNKNOWN_FUNCTION, refused
            errors = client.extension_errors()
        (message,) = [m for source, m in errors.items() if "short" in source]
        assert "too short" in message and "TOOLFLEET_EXT_SHORT_TOKEN" in message, errors
    finally:
        fleet.stop()
    assert "Q7z" not in fleet.log()
