"""The documented public API type-checks as users write it (mypy --strict), and a misuse
of it does not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from toolfleet.worker.devtools.scaffold import write_extension

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "tests" / "typed_api" / "api.py"
PARTS = ("shared", "producer", "worker", "extensions", "testing")


def _mypy(tmp_path: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    """mypy --strict on ``files`` with the project's mypy settings, the toolfleet.* layout
    given as symlinks (mypy cannot follow setuptools' editable finder; .ci/check does the
    same, and the settings skip toolfleet's untyped dependencies, which an installed
    toolfleet's users never see reported)."""
    layout = tmp_path / "layout" / "toolfleet"
    layout.mkdir(parents=True)
    for part in PARTS:
        (layout / part).symlink_to(ROOT / part)
    env = {**os.environ, "MYPYPATH": str(layout.parent)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
         "--config-file", str(ROOT / "pyproject.toml"),
         "--cache-dir", str(tmp_path / "cache"), *map(str, files)],
        capture_output=True, text=True, env=env, timeout=300, check=False, cwd=tmp_path,
    )  # fmt: skip


def test_the_documented_api_type_checks_as_users_write_it(tmp_path: Path) -> None:
    """tests/typed_api/api.py (clients, results, run_tool, the fixtures) and the files
    ``toolfleet new`` writes pass mypy --strict."""
    scaffold = write_extension(tmp_path, "typed-ext")
    out = _mypy(tmp_path, API, *(p for p in scaffold if p.suffix == ".py"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_misuse_of_the_api_fails_the_check(tmp_path: Path) -> None:
    """The check has teeth: a wrong type for run_tool's result and a wrong fixture attribute
    are errors."""
    wrong = tmp_path / "wrong.py"
    wrong.write_text(
        "from toolfleet.testing import FleetFactory, run_tool\n"
        "def test_x(toolfleet_fleet: FleetFactory) -> None:\n"
        "    text: str = run_tool('m:a', 'x', {})\n"
        "    toolfleet_fleet('m:a').cleint\n"
    )
    out = _mypy(tmp_path, wrong)
    assert out.returncode == 1, out.stdout + out.stderr
    assert 'Incompatible types in assignment (expression has type "ToolCallResult"' in out.stdout
    assert '"RunningFleet" has no attribute "cleint"' in out.stdout, out.stdout
