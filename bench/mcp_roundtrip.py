"""MCP tools through a fleet: round trips, a timeout with its cancellation, a killed server.

Starts ``toolfleet worker -p 2`` on the Redis of ``TOOLFLEET_REDIS_URL`` (default
``redis://127.0.0.1:6379/0``) under a throwaway namespace with two stdio MCP servers loaded
by manifest: ``tests/mcp_servers/probe_server.py`` (built with the official SDK) and the
reference ``mcp-server-time`` (the dev extra). Then, one call at a time:

- ``N`` calls (default 200) of the probe's ``echo`` and of ``get_current_time``:
  round-trip p50 / p95, milliseconds;
- 10 calls of the probe's ``slow`` (60 s) under a 1 s limit: milliseconds from the limit
  to the ``timeout`` reply, and how many cancellations the server saw;
- one of the two probe servers SIGKILLed: seconds until its replacement answers.

Needs ``toolfleet[mcp]`` and ``mcp-server-time`` installed (``pip install -e '.[dev,mcp]'``)::

    python bench/mcp_roundtrip.py [N]
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _process import load_average, stop_process

from toolfleet.producer import ToolClient
from toolfleet.shared import Status

PROBE = Path(__file__).resolve().parent.parent / "tests" / "mcp_servers" / "probe_server.py"
TIME_SERVER = Path(sys.executable).parent / "mcp-server-time"
LIMIT_S = 1.0


def _manifest(folder: Path, slug: str, body: str) -> None:
    (folder / slug).mkdir(parents=True)
    (folder / slug / "extension.toml").write_text(
        f'slug = "{slug}"\nversion = "1.0.0"\n' + body, encoding="utf-8"
    )


def _round_trips(client: ToolClient, function: str, arguments: dict[str, str], n: int) -> str:
    times_ms: list[float] = []
    for _ in range(n):
        started = time.monotonic()
        result = client.call(function, arguments, timeout_s=20)
        times_ms.append((time.monotonic() - started) * 1000)
        if not result.ok:
            raise SystemExit(f"{function}: {result.status.value} {result.content}")
    cuts = statistics.quantiles(times_ms, n=20)
    return f"p50 {statistics.median(times_ms):.1f} ms / p95 {cuts[18]:.1f} ms ({n} calls)"


def _wait_ok(client: ToolClient, function: str, within_s: float) -> float:
    """Seconds until ``function`` answers ok (each try with a 2 s deadline)."""
    started = time.monotonic()
    while time.monotonic() < started + within_s:
        if client.call(function, {"text": "x"}, timeout_s=2).ok:
            return time.monotonic() - started
        time.sleep(0.05)
    raise SystemExit(f"{function} did not answer ok within {within_s} s")


def _server_pids(client: ToolClient, known: set[int], new: int) -> set[int]:
    """Call the probe's ``pid`` until ``new`` server pids not in ``known`` have answered."""
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while len(seen) < new:
        if time.monotonic() > deadline:
            raise SystemExit(f"not {new} new probe servers within 60 s: {seen}")
        result = client.call("ext_probe_pid", {}, timeout_s=5)
        if result.ok:
            pid = int(result.content["result"])
            if pid not in known:
                seen.add(pid)
    return seen


def main() -> None:
    """Print the round trips, the timeouts and the replacement of a killed server."""
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    if not TIME_SERVER.exists():
        raise SystemExit(f"{TIME_SERVER} not found: pip install -e '.[dev,mcp]'")
    redis_url = os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        folder, marks = tmp / "extensions", tmp / "marks"
        marks.mkdir()
        _manifest(folder, "time", f'[mcp]\ncommand = "{TIME_SERVER}"\n')
        _manifest(
            folder,
            "probe",
            f"[mcp]\ncommand = {json.dumps(sys.executable)}\n"
            f"args = {json.dumps([str(PROBE), '--marks', str(marks)])}\n"
            f"[tools.slow]\ntimeout = {LIMIT_S}\n",
        )
        namespace = f"mcp-bench-{uuid.uuid4().hex[:6]}"
        env = {
            **os.environ,
            "TOOLFLEET_REDIS_URL": redis_url,
            "TOOLFLEET_NAMESPACE": namespace,
            "TOOLFLEET_EXTENSION_PATHS": str(folder),
            "TOOLFLEET_METRICS_PORT": "0",
            "TOOLFLEET_HEALTH_DIR": str(tmp / "health"),
        }
        argv = [os.path.join(os.path.dirname(sys.executable), "toolfleet"), "worker", "-p", "2"]
        log = (tmp / "worker.log").open("wb")
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            with ToolClient(redis_url, namespace=namespace) as client:
                _wait_ok(client, "ext_probe_echo", 120)
                _wait_ok(client, "ext_probe_echo", 120)  # both processes' servers started
                time.sleep(2)
                echo = _round_trips(client, "ext_probe_echo", {"text": "x"}, n)
                clock = _round_trips(client, "ext_time_get_current_time", {"timezone": "UTC"}, n)
                print(f"round trip, probe echo: {echo}")
                print(f"round trip, mcp-server-time get_current_time: {clock}")
                late_ms: list[float] = []
                for i in range(10):
                    started = time.monotonic()
                    result = client.call(
                        "ext_probe_slow", {"seconds": 60, "label": f"b{i}"}, timeout_s=20
                    )
                    late_ms.append((time.monotonic() - started - LIMIT_S) * 1000)
                    if result.status is not Status.TIMEOUT:
                        raise SystemExit(f"slow: {result.status.value} {result.content}")
                time.sleep(1)
                seen = len(list(marks.glob("cancelled-b*")))
                print(
                    f"timeout after a {LIMIT_S:g} s limit: {min(late_ms):.0f}–{max(late_ms):.0f} ms"
                    f" (median {statistics.median(late_ms):.0f}) after the limit; "
                    f"{seen}/10 cancellations seen by the server"
                )
                servers = _server_pids(client, set(), 2)
                killed = min(servers)
                os.kill(killed, signal.SIGKILL)
                killed_at = time.monotonic()
                _server_pids(client, servers, 1)
                print(
                    f"one probe server SIGKILLed: its replacement answered "
                    f"{time.monotonic() - killed_at:.2f} s later"
                )
            print(f"load average: {load_average()}")
        finally:
            stop_process(process, log)


if __name__ == "__main__":
    main()
