"""Import boundaries between the parts (producer, shared, worker, extensions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_producer_imports_no_worker_or_extension_code() -> None:
    """A fresh interpreter importing toolfleet.producer loads no worker or extension module."""
    code = (
        "import sys, toolfleet.producer\n"
        "parts = ('toolfleet.worker', 'toolfleet.extensions')\n"
        "bad = [m for m in sys.modules if m.startswith(parts)]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_shared_imports_no_other_part() -> None:
    """toolfleet.shared imports neither producer, worker nor extensions."""
    code = (
        "import sys, toolfleet.shared\n"
        "bad = [m for m in sys.modules if m.startswith(('toolfleet.worker', 'toolfleet.producer', "
        "'toolfleet.extensions'))]\n"
        "sys.exit(1 if bad else 0)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
