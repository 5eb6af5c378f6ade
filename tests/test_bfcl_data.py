"""The tests that replay BFCL data read the folder ``TOOLFLEET_BFCL_DIR`` names, and skip
saying to set it (and where the public files are) when it is not set or lacks a file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import BFCL_SOURCE, TESTS


def _skip_reason(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         str(TESTS / "test_schema_import.py"), "-k", "exec_and_rest_definitions_import"],
        capture_output=True, text=True, timeout=120, check=False, cwd=TESTS.parent,
        env={k: v for k, v in env.items() if k != "CI"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    skipped = [line for line in done.stdout.splitlines() if line.startswith("SKIPPED")]
    assert skipped, done.stdout
    return skipped[0]


def test_without_the_setting_the_skip_says_to_set_it() -> None:
    """No ``TOOLFLEET_BFCL_DIR``: the skip names the variable and the public data."""
    env = {k: v for k, v in os.environ.items() if k != "TOOLFLEET_BFCL_DIR"}
    reason = _skip_reason(env)
    assert "TOOLFLEET_BFCL_DIR is not set" in reason and BFCL_SOURCE in reason


def test_a_folder_without_the_files_is_named_in_the_skip(tmp_path: Path) -> None:
    """``TOOLFLEET_BFCL_DIR`` naming a folder without the files: the skip names that folder."""
    reason = _skip_reason({**os.environ, "TOOLFLEET_BFCL_DIR": str(tmp_path)})
    assert f"not in {tmp_path}" in reason and "TOOLFLEET_BFCL_DIR" in reason
