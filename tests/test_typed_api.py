"""The documented public API type-checks as users write it (mypy --strict), and a misuse
of it does not."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from toolfleet.worker.devtools.scaffold import write_extension

ROOT = Path(__file__).resolve().parents[1]
API = ROOT / "tests" / "typed_api" / "api.py"
PARTS = ("shared", "producer", "worker", "extensions", "testing")


def _mypy(tmp_path: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    """mypy --strict on ``files`` with the project's mypy settings, the toolfleet.* layout
    of the work tree given as symlinks, as .ci/check does (the settings skip toolfleet's
    untyped dependencies, which an installed toolfleet's users never see reported; a user's
    project beside an editable install: tests/test_packaging.py)."""
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


WRONG = (
    "from toolfleet.testing import FleetFactory, run_tool\n"
    "def test_x(toolfleet_fleet: FleetFactory) -> None:\n"
    "    text: str = run_tool('m:a', 'x', {})\n"
    "    toolfleet_fleet('m:a').cleint\n"
)


@dataclass(frozen=True)
class Checked:
    """One mypy run over the API file, the scaffold's files and a misuse (``wrong.py``)."""

    good: list[Path]
    wrong: Path
    out: subprocess.CompletedProcess[str]

    def errors_in(self, path: Path) -> list[str]:
        """The ``error:`` lines mypy reported for ``path`` (as given or relative to its run)."""
        names = {str(path)}
        if path.is_relative_to(self.wrong.parent):
            names.add(str(path.relative_to(self.wrong.parent)))
        return [
            line
            for line in self.out.stdout.splitlines()
            if ": error:" in line and line.split(":", 1)[0] in names
        ]


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Checked:
    """mypy run once for both tests (a run costs seconds of CPU)."""
    tmp_path = tmp_path_factory.mktemp("typed")
    scaffold = write_extension(tmp_path, "typed-ext")
    good = [API, *(p for p in scaffold if p.suffix == ".py")]
    wrong = tmp_path / "wrong.py"
    wrong.write_text(WRONG)
    return Checked(good, wrong, _mypy(tmp_path, *good, wrong))


def test_the_documented_api_type_checks_as_users_write_it(checked: Checked) -> None:
    """tests/typed_api/api.py (clients, results, run_tool, the fixtures) and the files
    ``toolfleet new`` writes pass mypy --strict."""
    out = checked.out
    assert out.returncode in (0, 1), out.stdout + out.stderr  # 1: wrong.py's errors
    for path in checked.good:
        assert checked.errors_in(path) == [], out.stdout + out.stderr
    reported = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert len(reported) == len(checked.errors_in(checked.wrong)), out.stdout


def test_a_misuse_of_the_api_fails_the_check(checked: Checked) -> None:
    """The check has teeth: a wrong type for run_tool's result and a wrong fixture attribute
    are errors."""
    out = checked.out
    assert out.returncode == 1, out.stdout + out.stderr
    wrong = "\n".join(checked.errors_in(checked.wrong))
    assert 'Incompatible types in assignment (expression has type "ToolCallResult"' in wrong, wrong
    assert '"RunningFleet" has no attribute "cleint"' in wrong, out.stdout
