"""How long after its limit a stuck tool's ``timeout`` reply arrives, per isolation.

Starts ``toolfleet worker -p 1 -t 4`` with ``bench/apps/stuck_tools.py`` (a thread tool in
``time.sleep``, a ``process`` tool in a pure-Python busy loop, a ``process`` tool inside
one GIL-holding C call, the ``python`` tool running ``while True: pass``; each with a 1 s
limit) on the Redis of ``TOOLFLEET_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``)
under a throwaway namespace, calls each tool ``N`` times one after the other (default 5)
and prints, per tool, the statuses and the milliseconds from the limit to the reply
(min / median / max), plus the load average::

    python bench/stuck_timeouts.py [N]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _process import load_average, stop_process

from toolfleet.producer import ToolClient

APPS = Path(__file__).resolve().parent / "apps"
LIMIT_S = 1.0
READY = "ext_stuck_ready"
CASES = [
    ("thread tool, time.sleep", "ext_stuck_thread_sleep", {}),
    ("process tool, busy loop", "ext_stuck_process_spin", {}),
    ("process tool, GIL-holding C call", "ext_stuck_process_gil_hold", {}),
    ("python tool, while True: pass", "ext_python_stuck_run", {"code": "while True: pass"}),
]


def _wait_ready(client: ToolClient, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the worker exited with {process.returncode}")
        if client.call(READY, {}, timeout_s=2).ok:
            return
        time.sleep(0.2)
    raise SystemExit("the fleet did not answer in 120 s")


def main() -> None:
    """Print one line per stuck tool: statuses and ms from the limit to the reply."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    redis_url = os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    namespace = f"stuck-bench-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(APPS), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "TOOLFLEET_REDIS_URL": redis_url,
            "TOOLFLEET_NAMESPACE": namespace,
            "TOOLFLEET_METRICS_PORT": "0",
            "TOOLFLEET_HEALTH_DIR": f"{tmp}/health",
        }
        argv = [
            os.path.join(os.path.dirname(sys.executable), "toolfleet"),
            "worker", "-p", "1", "-t", "4",
            "--extension", "stuck_tools:extension",
            "--extension", "stuck_tools:python_extension",
        ]  # fmt: skip
        log = open(f"{tmp}/worker.log", "wb")  # noqa: SIM115 - closed in finally
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            with ToolClient(redis_url, namespace=namespace) as client:
                _wait_ready(client, process)
                context = {"account": "bench", "conversation": f"c-{uuid.uuid4().hex[:8]}"}
                for label, function, arguments in CASES:
                    late_ms: list[float] = []
                    statuses: list[str] = []
                    for _ in range(rounds):
                        started = time.monotonic()
                        result = client.call(function, arguments, context=context, timeout_s=20)
                        late_ms.append((time.monotonic() - started - LIMIT_S) * 1000)
                        statuses.append(f"{result.status.value}{'' if result.worker else '*'}")
                    print(
                        f"{label}: {' '.join(sorted(set(statuses)))} {len(statuses)}x; reply "
                        f"{min(late_ms):.0f} / {statistics.median(late_ms):.0f} / "
                        f"{max(late_ms):.0f} ms (min / median / max) after the {LIMIT_S:g} s limit"
                    )
                    if any(s.endswith("*") for s in statuses):
                        print("  (* = answered by the producer's deadline, not a worker)")
            print(f"load average: {load_average()}")
        finally:
            stop_process(process, log)


if __name__ == "__main__":
    main()
