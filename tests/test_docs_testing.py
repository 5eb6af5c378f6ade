"""docs/testing.md stays true: its standalone block runs, its two files pass with pytest in a
fresh folder, and every other Python block is marked as a fragment."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "testing.md"
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)\n```", re.DOTALL)
FILE = re.compile(r"# file: (?P<name>[\w.]+)\n")


def _blocks() -> list[tuple[bool, str]]:
    """Each Python block of the page: (marked as a fragment, its code)."""
    text = PAGE.read_text(encoding="utf-8")
    return [(m["before"].strip() == "<!-- fragment -->", m["code"]) for m in BLOCK.finditer(text)]


def test_the_page_has_blocks_of_each_kind() -> None:
    """The checks below see the page's blocks (two files, one standalone, two fragments),
    and each of them parses."""
    blocks = _blocks()
    files = [code for fragment, code in blocks if not fragment and FILE.match(code)]
    assert (len(blocks), len(files), sum(f for f, _ in blocks)) == (5, 2, 2)
    for _, code in blocks:
        ast.parse(code)  # fragments too are Python


def test_the_standalone_block_runs(tmp_path: Path) -> None:
    """The run_tool example runs as written and its asserts hold."""
    (code,) = [c for fragment, c in _blocks() if not fragment and not FILE.match(c)]
    script = tmp_path / "example.py"
    script.write_text(code)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         cwd=tmp_path, timeout=120, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_pages_tool_and_test_files_pass_with_pytest(tmp_path: Path) -> None:
    """shout_tools.py and test_shout.py, written as the page shows them, pass with pytest."""
    for fragment, code in _blocks():
        found = FILE.match(code)
        if found and not fragment:
            (tmp_path / found["name"]).write_text(code)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shout_tools.py", "test_shout.py"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "PYTHON"))}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "pytest"), "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "2 passed" in out.stdout, out.stdout
