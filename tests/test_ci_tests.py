"""The end of ``.ci/check``'s test run says what was slow and why tests skipped, briefly:
the 15 slowest tests, and one summary line per skip reason (not one per test)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import BFCL_SOURCE, TESTS

ROOT = TESTS.parent


def test_the_run_lists_the_slowest_tests_and_folds_identical_skips() -> None:
    """``.ci/tests`` (the test run of ``.ci/check``) on two files whose BFCL tests skip
    without ``TOOLFLEET_BFCL_DIR``: the output lists the 15 slowest tests, and their skips
    make one ``SKIPPED [N]`` line naming the public files' address once."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "TOOLFLEET_BFCL_DIR")}
    env["VENV"] = str(Path(sys.executable).parent.parent)
    done = subprocess.run(
        ["bash", str(ROOT / ".ci" / "tests"), "-p", "no:cacheprovider",
         "tests/test_schema_import.py", "tests/test_bfcl_functions.py"],
        capture_output=True, text=True, timeout=600, check=False, cwd=ROOT, env=env,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "slowest 15 durations" in out, out
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    bfcl = [line for line in skips if "BFCL" in line]
    assert len(bfcl) == 1, "\n".join(skips)
    count = re.match(r"SKIPPED \[(\d+)\]", bfcl[0])
    assert count and int(count.group(1)) >= 10, bfcl[0]
    assert out.count(BFCL_SOURCE) == 1, out
