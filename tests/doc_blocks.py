"""Code blocks of the README and the docs pages, read and run the way docs/about-docs.md says.

A fenced block is marked by an HTML comment on the nearest non-blank line above it:

- ``<!-- fragment -->``: shown, never run (a piece of a larger program, a deployment's
  command);
- ``<!-- file: NAME -->``: written to ``NAME`` in the page's working folder before anything
  runs (a module a fleet loads, a manifest);
- ``<!-- output -->``: what the runnable block just before it prints, compared exactly.

Every other ``python`` and ``bash`` block runs, in order, in one working folder per page,
against a real fleet. A ``bash`` block whose one line is ``VAR=value ... toolfleet worker
ARGS`` is the page's fleet: the test starts it with those variables and arguments instead
of running the line.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+)(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*(?P<kind>fragment|output|file:\s*(?P<name>[\w./-]+))\s*-->\s*$")
RUNNABLE = ("python", "bash")


@dataclass(frozen=True)
class Block:
    """One fenced code block of a page."""

    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    body: str
    marker: str  # "", "fragment", "output" or "file"
    file_name: str = ""

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of ``path`` in order, with the marker above each."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            line = lines[j]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            j += 1
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = MARKER.match(lines[k]) if k >= 0 else None
        kind = "" if mark is None else mark["kind"].split(":")[0]
        name = "" if mark is None or mark["name"] is None else mark["name"]
        text = "\n".join(body) + "\n"
        found.append(Block(path, i + 1, opening["lang"], text, kind, name))
        i = j + 1
    return found


def markers_without_block(path: Path) -> list[int]:
    """Lines of markers that no fenced block follows (a marker that marks nothing)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    dangling = []
    for number, line in enumerate(lines):
        if MARKER.match(line):
            rest = [candidate for candidate in lines[number + 1 :] if candidate.strip()]
            if not rest or FENCE.match(rest[0]) is None:
                dangling.append(number + 1)
    return dangling


def worker_command(block: Block) -> tuple[dict[str, str], list[str]] | None:
    """``(variables, arguments)`` of ``VAR=value ... toolfleet worker ARGS`` when ``block``
    is a fleet's command line, else ``None``."""
    if block.lang != "bash" or block.marker == "fragment":
        return None
    lines = [line for line in block.body.splitlines() if line.strip()]
    for line in lines:
        argv = shlex.split(line, comments=True)
        variables: dict[str, str] = {}
        while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", argv[0]):
            name, _, value = argv.pop(0).partition("=")
            variables[name] = value
        if argv[:2] == ["toolfleet", "worker"]:
            if len(lines) != 1:
                raise AssertionError(
                    f"{block.where}: a `toolfleet worker` line stands alone in its block"
                )
            return variables, argv[2:]
    return None


@dataclass
class Run:
    """Where and against which fleet a page's blocks run.

    Python blocks run in one interpreter per page (``doc_runner.py``: imports are paid once,
    each block gets fresh globals); bash blocks each in their own shell.
    """

    folder: Path
    redis_url: str
    namespace: str
    _runner: subprocess.Popen[str] | None = None

    def environment(self) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": str(self.folder),
            "TOOLFLEET_REDIS_URL": self.redis_url,
            "TOOLFLEET_NAMESPACE": self.namespace,
        }

    def execute(self, block: Block, number: int) -> str:
        """Run one block; return its standard output, or raise with everything it printed."""
        if block.lang == "python":
            return self._python(block, number)
        done = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.body],
            cwd=self.folder,
            env=self.environment(),
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(
                f"{block.where} exited {done.returncode}\n--- block\n{block.body}"
                f"--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
            )
        return done.stdout

    def _python(self, block: Block, number: int) -> str:
        script = self.folder / f"block_{number:02d}.py"
        script.write_text(block.body, encoding="utf-8")
        if self._runner is None:
            self._runner = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("doc_runner.py"))],
                cwd=self.folder,
                env=self.environment(),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
        assert self._runner.stdin is not None and self._runner.stdout is not None
        self._runner.stdin.write(f"{script}\n")
        self._runner.stdin.flush()
        line = self._runner.stdout.readline()
        assert line, f"{block.where}: the block runner ended (exit {self._runner.wait()})"
        answer = json.loads(line)
        if not answer["ok"]:
            raise AssertionError(
                f"{block.where} failed\n--- block\n{block.body}--- stdout\n{answer['stdout']}"
                f"--- error\n{answer['error']}"
            )
        return str(answer["stdout"])

    def close(self) -> None:
        """End the page's python runner."""
        if self._runner is not None:
            assert self._runner.stdin is not None
            self._runner.stdin.close()
            try:
                self._runner.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._runner.kill()
                self._runner.wait()
            self._runner = None


def run_blocks(page: list[Block], run: Run, *, skip: frozenset[int] = frozenset()) -> int:
    """Run the page's runnable blocks in order, but those opening on a line in ``skip``;
    check each ``output`` block. Returns how many ran."""
    try:
        return _run_in_order(page, run, skip)
    finally:
        run.close()


def _run_in_order(page: list[Block], run: Run, skip: frozenset[int]) -> int:
    ran = 0
    last_output: str | None = None
    for number, block in enumerate(page):
        if block.marker == "output":
            assert last_output is not None, f"{block.where}: an output block follows no run"
            assert last_output.strip() == block.body.strip(), (
                f"{block.where}: printed\n{last_output}\nbut the page says\n{block.body}"
            )
            last_output = None
            continue
        last_output = None
        if block.marker in ("fragment", "file") or block.lang not in RUNNABLE or block.line in skip:
            continue
        if worker_command(block) is not None:
            continue
        last_output = run.execute(block, number)
        ran += 1
    return ran


def write_files(page: list[Block], folder: Path) -> None:
    """Write every ``file:`` block of the page into ``folder``."""
    for block in page:
        if block.marker == "file":
            target = folder / block.file_name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(block.body, encoding="utf-8")
