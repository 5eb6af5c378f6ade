"""``toolfleet new NAME``: a new extension folder whose test passes as written."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import toolfleet_command

ROOT = Path(__file__).resolve().parents[1]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "PYTHON"))}


def _new(cwd: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [toolfleet_command(), "new", name],
        cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_new_writes_an_extension_whose_test_passes_with_plain_pytest(tmp_path: Path) -> None:
    """toolfleet new demo-ext, then pytest in demo-ext: the manifest loads, and its four
    tests (run_tool and a real fleet on the embedded server) pass."""
    assert not tmp_path.is_relative_to(ROOT)
    made = _new(tmp_path, "demo-ext")
    assert made.returncode == 0, made.stdout + made.stderr
    folder = tmp_path / "demo-ext"
    assert sorted(p.name for p in folder.iterdir()) == [
        "demo_ext_tools.py",
        "extension.toml",
        "test_demo_ext.py",
    ]
    assert "cd demo-ext && pytest" in made.stdout
    pytest_script = Path(sys.executable).parent / "pytest"
    out = subprocess.run(
        [str(pytest_script), "-p", "no:cacheprovider", "-q"],
        cwd=folder, env=_clean_env(), capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 passed" in out.stdout, out.stdout
    check = subprocess.run(
        [toolfleet_command(), "extensions", "check", "--no-entry-points", str(folder)],
        env=_clean_env(), capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "demo-ext" in check.stdout


def test_new_refuses_a_folder_that_exists(tmp_path: Path) -> None:
    """An existing folder is left untouched and the command says why, exit 1."""
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep")
    out = _new(tmp_path, "taken")
    assert out.returncode == 1
    assert "exists already" in out.stderr, out.stderr
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["mine.txt"]


@pytest.mark.parametrize("name", ["bad name", "_leading-underscore", "a/b", "x" * 41, "dot.ted"])
def test_new_refuses_a_name_that_is_not_a_valid_slug(tmp_path: Path, name: str) -> None:
    """A name the manifest's slug rule refuses writes nothing and names the rule, exit 1."""
    out = _new(tmp_path, name)
    assert out.returncode == 1
    assert "is not a valid extension name" in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_slug_starting_with_a_digit_gets_an_importable_module(tmp_path: Path) -> None:
    """3d-shapes gets the module ext_3d_shapes_tools (a module name cannot start with one)."""
    out = _new(tmp_path, "3d-shapes")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "3d-shapes" / "ext_3d_shapes_tools.py").is_file()
    manifest = (tmp_path / "3d-shapes" / "extension.toml").read_text()
    assert 'entry = "ext_3d_shapes_tools:tools"' in manifest
