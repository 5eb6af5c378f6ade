"""Standard-library helpers of the single-figure scripts: load average, stopping a worker.

Only the standard library, so the scripts that use it need only the dev install, not the
bench extra (which :mod:`_common` needs for psutil).
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import IO


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, e.g. ``"1.20 0.80 0.50"``."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def stop_process(process: subprocess.Popen[bytes], log: IO[bytes], grace_s: float = 60) -> None:
    """SIGTERM ``process``, SIGKILL it after ``grace_s`` seconds, then close its ``log``."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
    log.close()
