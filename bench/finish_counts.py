"""Count the Redis commands a call costs on the answer path (counts only, no timing).

Starts a private ``redis-server`` and a fleet through the CLI (2 processes x 8 threads,
the tests' echo tool), then sends a burst of 5,000 calls (all submitted, then awaited)
and 500 sequential calls, and prints each phase's ``INFO commandstats`` deltas per call:
top-level commands, all commands (those run inside scripts included), ``EVALSHA`` and
every command by name. Idle fleet traffic (blocking waits, heartbeats) is counted too;
it is small next to the calls and the same before and after a change.

    .venv/bin/python bench/finish_counts.py [--burst 5000] [--sequential 500]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

from _common import PrivateRedis, Procs, counters_delta, redis_counters  # noqa: E402

from conftest import start_fleet  # noqa: E402
from toolfleet.producer import ToolClient  # noqa: E402

ECHO = "ext_fleet_test_echo"


def _per_call(delta: dict[str, Any], calls: int) -> dict[str, Any]:
    per = delta["per_command"]
    return {
        "calls": calls,
        "top_level_per_call": round(delta["total"] / calls, 2),
        "all_commands_per_call": round(sum(per.values()) / calls, 2),
        "evalsha_per_call": round(per.get("evalsha", 0) / calls, 2),
        "per_command_per_call": {c: round(n / calls, 3) for c, n in sorted(per.items())},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=5000)
    parser.add_argument("--sequential", type=int, default=500)
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
            before = redis_counters(r)
            futures = [client.submit(ECHO, {"text": "b"}, timeout_s=300) for _ in range(args.burst)]
            answers = [future.result(timeout=320) for future in futures]
            delta = counters_delta(before, redis_counters(r))
            assert all(answer.ok for answer in answers), {a.status for a in answers}
            results["burst"] = _per_call(delta, args.burst)
            before = redis_counters(r)
            for _ in range(args.sequential):
                assert client.call(ECHO, {"text": "s"}, timeout_s=30).ok
            delta = counters_delta(before, redis_counters(r))
            results["sequential"] = _per_call(delta, args.sequential)
        print(json.dumps(results, indent=2))
    finally:
        r.close()
        fleet.stop()
        server.stop()
        procs.stop_all()


if __name__ == "__main__":
    main()
