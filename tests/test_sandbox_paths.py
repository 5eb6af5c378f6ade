"""The python sandbox sees an interpreter wherever it is installed, /tmp included."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from conftest import unavailable
from toolfleet.extensions.python._sandbox import unavailable_reason
from toolfleet.extensions.python.tool import PythonToolConfig


def test_sandbox_starts_an_interpreter_installed_under_tmp(tmp_path: Path) -> None:
    """A virtual environment under /tmp (where CI and many users check out) is not hidden
    by the sandbox's own empty /tmp, so the python tool is served there."""
    if shutil.which("bwrap") is None:
        unavailable("bubblewrap is not installed here (CI installs it)")
    assert str(tmp_path).startswith("/tmp/"), tmp_path
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    interpreter = str(venv / "bin" / "python3")
    assert unavailable_reason(PythonToolConfig(interpreter=interpreter)) is None
