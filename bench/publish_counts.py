"""Count the Redis commands and ``EVALSHA`` s a call costs from each client (counts only).

Starts a private ``redis-server`` and a fleet through the CLI (2 processes x 8 threads,
the tests' echo tool), then, for ``ToolClient`` and ``AsyncToolClient`` each, a burst of
5,000 calls submitted at once and 500 sequential calls, and prints per phase the
``INFO commandstats`` deltas per call (commands run inside scripts included): all
commands and ``EVALSHA`` (the workers' scripts too); then the same phase again under
``MONITOR``, counting the runs of the enqueue script alone. Idle fleet traffic (blocking waits,
heartbeats) is counted too; it is small next to the calls and the same before and after
a change. No timing: the figures hold on a loaded machine.

    .venv/bin/python bench/publish_counts.py [--out results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

from conftest import start_fleet  # noqa: E402
from private_redis import EnqueueRuns, start_tcp_server  # noqa: E402
from toolfleet.producer import AsyncToolClient, ToolClient  # noqa: E402
from toolfleet.shared import Status  # noqa: E402

ECHO = "ext_fleet_test_echo"
BURST = 5_000
SEQUENTIAL = 500


def _counters(client: redis.Redis) -> dict[str, Any]:
    """Top-level commands processed and per-command calls (inside scripts included)."""
    stats = client.info("stats")
    commands = client.info("commandstats")
    per = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in commands.items()}
    return {"total": int(stats["total_commands_processed"]), "per_command": per}


def _delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two :func:`_counters` snapshots (minus their own INFOs)."""
    was = before["per_command"]
    per = {k: v - was.get(k, 0) for k, v in after["per_command"].items() if v - was.get(k, 0)}
    return {"total": after["total"] - before["total"] - 2, "per_command": per}


def _per_call(delta: dict[str, Any], calls: int, enqueues: int) -> dict[str, float]:
    per = delta["per_command"]
    return {
        "calls": calls,
        "enqueue_scripts": enqueues,
        "enqueue_scripts_per_call": round(enqueues / calls, 4),
        "commands_per_call": round(delta["total"] / calls, 3),
        "evalsha_per_call": round(per.get("evalsha", 0) / calls, 4),
        "hset_per_call": round(per.get("hset", 0) / calls, 3),
    }


def _sync_burst(url: str, ns: str) -> list[Status]:
    with ToolClient(url, namespace=ns) as client:
        futures = [client.submit(ECHO, {"text": str(i)}, timeout_s=300) for i in range(BURST)]
        return [f.result().status for f in futures]


def _sync_sequential(url: str, ns: str) -> list[Status]:
    with ToolClient(url, namespace=ns) as client:
        return [client.call(ECHO, {"text": str(i)}).status for i in range(SEQUENTIAL)]


async def _async_burst(url: str, ns: str) -> list[Status]:
    async with AsyncToolClient(url, namespace=ns) as client:
        futures = [await client.submit(ECHO, {"text": str(i)}, timeout_s=300) for i in range(BURST)]
        return [(await f).status for f in futures]


async def _async_sequential(url: str, ns: str) -> list[Status]:
    async with AsyncToolClient(url, namespace=ns) as client:
        return [(await client.call(ECHO, {"text": str(i)})).status for i in range(SEQUENTIAL)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    options = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="pubcount-"))
    server = start_tcp_server(folder)
    namespace = f"pubcount-{uuid.uuid4().hex[:6]}"
    log = folder / "worker.log"
    path = os.pathsep.join(
        filter(None, [str(BENCH.parent / "tests"), os.environ.get("PYTHONPATH")])
    )
    fleet = start_fleet(
        server.url, namespace, log, processes=2, threads=8, env={"PYTHONPATH": path}
    )
    r = redis.Redis.from_url(server.url)
    results: dict[str, Any] = {}
    try:
        _sync_sequential(server.url, namespace)  # warm: scripts loaded, catalog read
        phases: dict[str, Callable[[], list[Status]]] = {
            "sync_burst": lambda: _sync_burst(server.url, namespace),
            "sync_sequential": lambda: _sync_sequential(server.url, namespace),
            "async_burst": lambda: asyncio.run(_async_burst(server.url, namespace)),
            "async_sequential": lambda: asyncio.run(_async_sequential(server.url, namespace)),
        }
        for name, phase in phases.items():
            before = _counters(r)
            statuses = phase()
            delta = _delta(before, _counters(r))
            with EnqueueRuns(server.url) as enqueues:  # again, under MONITOR
                again = phase()
            assert statuses == again == [Status.OK] * len(statuses), {*statuses, *again}
            results[name] = _per_call(delta, len(statuses), enqueues.runs)
            print(name, json.dumps(results[name]), flush=True)
    finally:
        r.close()
        fleet.stop()
        server.stop()
    if options.out is not None:
        options.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
