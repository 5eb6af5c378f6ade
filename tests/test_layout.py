"""Packaging and import boundaries."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
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


def test_wheel_holds_only_toolfleet_and_every_subpackage(tmp_path: Path) -> None:
    """The built wheel has only toolfleet/... files, every sub-package and the demo sample."""
    build = tmp_path / "src"
    shutil.copytree(
        ROOT,
        build,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
        ),
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(build),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    wheel = next((tmp_path / "dist").glob("toolfleet-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    payload = [n for n in names if ".dist-info/" not in n]
    assert payload and all(n.startswith("toolfleet/") for n in payload), payload
    assert "toolfleet/__init__.py" not in names  # an implicit namespace
    expected_packages = {"shared", "producer", "worker", "extensions", "extensions/bfcl"}
    for package in expected_packages:
        assert f"toolfleet/{package}/__init__.py" in names, package
    for folder in ("shared", "producer", "worker", "extensions"):
        for init in (ROOT / folder).rglob("__init__.py"):
            assert f"toolfleet/{init.relative_to(ROOT).as_posix()}" in names
        assert f"toolfleet/{folder}/py.typed" in names
    assert "toolfleet/worker/samples/demo.jsonl" in names
    assert not any(n.startswith(("toolfleet/tests", "toolfleet/deploy")) for n in names)
