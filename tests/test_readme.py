"""The shell examples of the README and the docs pages name commands the CLI has (the docs'
shell blocks do not run: tests/test_docs.py runs the README's and the docs' python)."""

from __future__ import annotations

import re

import click
from click.testing import CliRunner

from conftest import TESTS
from toolfleet.worker.cli.main import cli

README = TESTS.parent / "README.md"
PAGES = [README, *sorted((TESTS.parent / "docs").rglob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell", "console"}


def _shell_lines(text: str) -> list[str]:
    """Lines of the README's shell code blocks that run ``toolfleet`` (or ``.venv/bin/``'s)."""
    lines, fence = [], None
    for raw in text.splitlines():
        stripped = raw.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip() if fence is None else None
            continue
        if fence in SHELL_FENCES:
            line = stripped.removeprefix("$ ")
            if re.match(r"(\.venv/bin/)?toolfleet(\s|$)", line):
                lines.append(line)
    return lines


def _command_path(line: str) -> list[str]:
    """The sub-command names a README line invokes, e.g. ``["mcp", "serve"]``."""
    words = line.split("#", 1)[0].split()[1:]  # the names come first, before any quoting
    path: list[str] = []
    command: click.Command = cli
    while isinstance(command, click.Group) and words and not words[0].startswith("-"):
        found = command.commands.get(words[0])
        assert found is not None, (
            f"{line!r}: `{' '.join(['toolfleet', *path, words[0]])}` is not a command"
        )
        path.append(words.pop(0))
        command = found
    return path


def test_every_toolfleet_command_in_the_readme_exists() -> None:
    """Each `toolfleet ...` line of the shell blocks of the README and the docs names a real
    command, and `toolfleet <command> --help` exits 0."""
    lines = [line for page in PAGES for line in _shell_lines(page.read_text())]
    assert len(lines) >= 5, lines
    runner = CliRunner()
    for line in lines:
        path = _command_path(line)
        assert path, f"{line!r} names no command"
        result = runner.invoke(cli, [*path, "--help"])
        assert result.exit_code == 0, (line, result.output)


def test_the_readme_command_check_catches_a_missing_command() -> None:
    """A line naming a command the CLI lacks fails the check (the test above can fail)."""
    text = "```bash\ntoolfleet no-such-command --x\n```\n"
    (line,) = _shell_lines(text)
    try:
        _command_path(line)
    except AssertionError as exc:
        assert "no-such-command" in str(exc)
    else:
        raise AssertionError("a missing command passed")
