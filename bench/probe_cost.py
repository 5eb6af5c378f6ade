"""CPU the supervisor spends per HTTP probe (``/livez``, ``/readyz``), milliseconds.

Starts ``toolfleet worker -p 2`` on the Redis of ``TOOLFLEET_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``) under a throwaway namespace, sends ``N`` GETs to each probe
and reads the supervisor's user+system CPU time (``/proc/PID/stat``, Linux) before and
after::

    python bench/probe_cost.py [N]
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """User plus system CPU seconds of ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def main() -> None:
    """Print the CPU milliseconds per probe request of each path."""
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    port = _free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "TOOLFLEET_REDIS_URL": os.environ.get(
                "TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0"
            ),
            "TOOLFLEET_NAMESPACE": f"probe-bench-{uuid.uuid4().hex[:6]}",
            "TOOLFLEET_METRICS_PORT": str(port),
            "TOOLFLEET_HEALTH_DIR": f"{tmp}/health",
        }
        bin_dir = os.path.dirname(sys.executable)
        argv = [os.path.join(bin_dir, "toolfleet"), "worker", "-p", "2"]
        process = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            deadline = time.monotonic() + 60
            while _get_quiet(f"http://127.0.0.1:{port}/readyz") != 200:
                if time.monotonic() > deadline:
                    raise SystemExit("the fleet did not become ready in 60 s")
                time.sleep(0.2)
            for path in ("/livez", "/readyz"):
                before = _cpu_s(process.pid)
                for _ in range(count):
                    _get(f"http://127.0.0.1:{port}{path}")
                spent = _cpu_s(process.pid) - before
                print(f"{path}: {spent / count * 1000:.2f} ms CPU per probe ({count} probes)")
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def _get_quiet(url: str) -> int:
    try:
        return _get(url)
    except OSError:
        return 0


if __name__ == "__main__":
    main()
