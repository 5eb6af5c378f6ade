"""Count the Redis commands a call costs on the answer path (counts only, no timing).

Starts a private ``redis-server`` and a fleet through the CLI (2 processes x 8 threads,
the tests' echo tool), then sends a burst of 5,000 calls (all submitted, then awaited)
and 500 sequential calls, and prints each phase's ``INFO commandstats`` deltas per call:
top-level commands, all commands (those run inside scripts included), ``EVALSHA`` and
every command by name. Idle fleet traffic (blocking waits, heartbeats) grows with a
phase's wall time, which load changes, so it is also measured alone (``--idle`` seconds
with no call) and subtracted, per command, at its rate times the phase's wall time: the
``net`` figures are the commands the calls themselves cost.

    .venv/bin/python bench/finish_counts.py [--burst 5000] [--sequential 500]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

from _common import PrivateRedis, Procs, counters_delta, redis_counters  # noqa: E402

from conftest import start_fleet  # noqa: E402
from toolfleet.producer import ToolClient  # noqa: E402

ECHO = "ext_fleet_test_echo"


def _per_call(
    delta: dict[str, Any], calls: int, seconds: float, idle: dict[str, float]
) -> dict[str, Any]:
    per = delta["per_command"]
    net = {c: n - idle.get(c, 0.0) * seconds for c, n in per.items()}
    return {
        "calls": calls,
        "wall_s": round(seconds, 1),
        "all_commands_per_call": round(sum(per.values()) / calls, 2),
        "evalsha_per_call": round(per.get("evalsha", 0) / calls, 2),
        "net_all_commands_per_call": round(sum(net.values()) / calls, 2),
        "net_evalsha_per_call": round(net.get("evalsha", 0) / calls, 2),
        "net_per_command_per_call": {c: round(n / calls, 3) for c, n in sorted(net.items())},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--idle", type=float, default=20.0)
    args = parser.parse_args(argv)
    procs = Procs()
    server = PrivateRedis(procs).start()
    namespace = f"finishbench-{uuid.uuid4().hex[:6]}"
    log = Path(tempfile.mkdtemp(prefix="finishbench-")) / "worker.log"
    path = os.pathsep.join(
        filter(None, [str(BENCH.parent / "tests"), os.environ.get("PYTHONPATH")])
    )
    fleet = start_fleet(
        server.url, namespace, log, processes=2, threads=8, env={"PYTHONPATH": path}
    )
    r = server.client()
    results: dict[str, Any] = {}
    try:
        with ToolClient(server.url, namespace=namespace) as client:
            for _ in range(20):
                assert client.call(ECHO, {"text": "w"}).ok
            before, started = redis_counters(r), time.monotonic()
            time.sleep(args.idle)
            delta = counters_delta(before, redis_counters(r))
            seconds = time.monotonic() - started
            idle = {c: n / seconds for c, n in delta["per_command"].items()}
            results["idle_commands_per_s"] = round(sum(idle.values()), 1)
            before, started = redis_counters(r), time.monotonic()
            futures = [client.submit(ECHO, {"text": "b"}, timeout_s=300) for _ in range(args.burst)]
            answers = [future.result(timeout=320) for future in futures]
            delta = counters_delta(before, redis_counters(r))
            seconds = time.monotonic() - started
            assert all(answer.ok for answer in answers), {a.status for a in answers}
            results["burst"] = _per_call(delta, args.burst, seconds, idle)
            before, started = redis_counters(r), time.monotonic()
            for _ in range(args.sequential):
                assert client.call(ECHO, {"text": "s"}, timeout_s=30).ok
            delta = counters_delta(before, redis_counters(r))
            seconds = time.monotonic() - started
            results["sequential"] = _per_call(delta, args.sequential, seconds, idle)
        print(json.dumps(results, indent=2))
    finally:
        r.close()
        fleet.stop()
        server.stop()
        procs.stop_all()


if __name__ == "__main__":
    main()
