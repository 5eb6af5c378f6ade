"""Count the Redis commands a call costs through the account lanes (counts only, no timing).

Starts a private ``redis-server`` and a fleet through the CLI (2 processes x 8 threads,
the tests' echo tool), then runs 2,000 concurrent calls from 2 accounts (one ``dispatch``
turn of 1,000 calls each, side by side) and 200 sequential calls, and prints the
``INFO commandstats`` deltas of each phase per call (commands run inside scripts
included), LPOP separately. Idle fleet traffic (blocking waits, heartbeats) is counted
too; it is small next to 2,000 calls and the same before and after a change. A last
phase of 200 more sequential calls runs under ``MONITOR`` to split the LPOPs by key
(queue list, lane rotation, lanes, others such as reply lists) and every command by the
script it ran in (``EVALSHA`` and the commands inside it, by script name) or by name.

    .venv/bin/python bench/lane_commands.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent / "tests")]

from _common import PrivateRedis, Procs, counters_delta, end_monitor, redis_counters  # noqa: E402

from conftest import start_fleet  # noqa: E402
from toolfleet.producer import ToolClient  # noqa: E402

ECHO = "ext_fleet_test_echo"
CONCURRENT = 1_000  # per account
SEQUENTIAL = 200
ACCOUNTS = ("A", "B")


def _turn(client: ToolClient, account: str, out: list[dict[str, Any]]) -> None:
    calls = [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": ECHO, "arguments": json.dumps({"text": "x"})}}
        for i in range(CONCURRENT)
    ]  # fmt: skip
    out.extend(client.dispatch(calls, context={"account": account}, timeout_s=300))


def _per_call(delta: dict[str, Any], calls: int) -> dict[str, float]:
    per = delta["per_command"]
    return {
        "calls": calls,
        "commands_per_call": round(delta["total"] / calls, 2),
        "incl_in_scripts_per_call": round(sum(per.values()) / calls, 2),
        "lpop_per_call": round(per.get("lpop", 0) / calls, 2),
        "llen_per_call": round(per.get("llen", 0) / calls, 2),
        "rpush_per_call": round(per.get("rpush", 0) / calls, 2),
        "evalsha_per_call": round(per.get("evalsha", 0) / calls, 2),
        "per_command_per_call": {c: round(n / calls, 2) for c, n in sorted(per.items())},
    }


def _script_names() -> dict[str, str]:
    """SHA1 -> name of every packaged script, with the constants its users fill in."""
    import hashlib

    from toolfleet.shared import scripts
    from toolfleet.shared.cancels import REQUESTED, RESOLVED
    from toolfleet.shared.catalog_epoch import WINDOW_MARK
    from toolfleet.shared.tenancy.lanes import TOKEN

    constants = {
        "TOKEN": TOKEN,
        "REQUESTED": REQUESTED.decode(),
        "RESOLVED": RESOLVED.decode(),
        "WINDOW_MARK": WINDOW_MARK,
    }
    from dramatiq.brokers import redis as dramatiq_redis

    dispatch = (Path(dramatiq_redis.__file__).parent / "redis" / "dispatch.lua").read_bytes()
    names = {hashlib.sha1(dispatch).hexdigest(): "dramatiq dispatch"}  # noqa: S324
    for name in scripts.names():
        source = scripts.source(name, **constants)
        names[hashlib.sha1(source.encode()).hexdigest()] = name  # noqa: S324 - Redis's hash
    return names


class LpopCensus:
    """LPOPs by key kind, read from ``MONITOR`` (slows Redis: counts only)."""

    def __init__(self, url: str, namespace: str, names: dict[str, str]) -> None:
        self.url = url
        self.namespace = namespace
        self.kinds: dict[str, int] = {}
        self.fetches = 0
        self.by_script: dict[str, dict[str, int]] = {}
        self._names = names
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _kind(self, key: str) -> str:
        if ".lane." in key:
            return "lane"
        if key.endswith(".lanes-active"):
            return "rotation"
        if key.startswith(f"{self.namespace}:tools.") and "." not in key.rsplit("-", 1)[-1]:
            return "queue"
        return "other"

    def _run(self) -> None:
        client = redis.Redis.from_url(self.url)
        with client.monitor() as monitor:
            self._ready.set()
            script = "-"
            while not self._stop.is_set():
                line = monitor.next_command()
                parts = str(line["command"]).split()
                name = parts[0].lower() if parts else ""
                if line["client_type"] != "lua":
                    script = "-"
                    if name == "evalsha" and len(parts) > 1:
                        script = self._names.get(parts[1], parts[1][:12])
                    elif name == "eval":
                        script = "(eval)"
                if line["client_type"] == "lua" or script != "-":
                    counts = self.by_script.setdefault(script, {})
                    counts[name] = counts.get(name, 0) + 1
                else:
                    counts = self.by_script.setdefault("(no script)", {})
                    counts[name] = counts.get(name, 0) + 1
                if name == "zadd" and parts[1].endswith("__heartbeats__"):
                    self.fetches += 1  # the fetch script's first command
                if name == "lpop" and len(parts) > 1:
                    kind = self._kind(parts[1])
                    self.kinds[kind] = self.kinds.get(kind, 0) + 1
        client.close()

    def start(self) -> LpopCensus:
        self._thread.start()
        self._ready.wait(5)
        return self

    def stop(self) -> None:
        end_monitor(self.url, self._stop, self._thread)


def main() -> None:
    names = _script_names()  # before the fleet starts: the scripts it loads
    procs = Procs()
    server = PrivateRedis(procs).start()
    namespace = f"lanebench-{uuid.uuid4().hex[:6]}"
    log = Path(tempfile.mkdtemp(prefix="lanebench-")) / "worker.log"
    path = os.pathsep.join(
        filter(None, [str(BENCH.parent / "tests"), os.environ.get("PYTHONPATH")])
    )
    fleet = start_fleet(
        server.url, namespace, log, processes=2, threads=8, env={"PYTHONPATH": path}
    )
    r = server.client()
    try:
        with ToolClient(server.url, namespace=namespace) as warm:
            for _ in range(20):
                warm.call(ECHO, {"text": "w"}, context={"account": "A"})
        results: dict[str, Any] = {}
        clients = [ToolClient(server.url, namespace=namespace) for _ in ACCOUNTS]
        answers: list[dict[str, Any]] = []
        before = redis_counters(r)
        threads = [
            threading.Thread(target=_turn, args=(client, account, answers))
            for client, account in zip(clients, ACCOUNTS, strict=True)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        delta = counters_delta(before, redis_counters(r))
        assert len(answers) == CONCURRENT * len(ACCOUNTS)
        results["concurrent"] = _per_call(delta, len(answers))
        for client in clients:
            client.close()
        with ToolClient(server.url, namespace=namespace) as seq:
            before = redis_counters(r)
            for i in range(SEQUENTIAL):
                seq.call(ECHO, {"text": "s"}, context={"account": ACCOUNTS[i % 2]})
            delta = counters_delta(before, redis_counters(r))
        results["sequential"] = _per_call(delta, SEQUENTIAL)
        with ToolClient(server.url, namespace=namespace) as seq:
            census = LpopCensus(server.url, namespace, names).start()
            for i in range(SEQUENTIAL):
                seq.call(ECHO, {"text": "m"}, context={"account": ACCOUNTS[i % 2]})
            census.stop()
        results["sequential_lpop_by_key_per_call"] = {
            kind: round(n / SEQUENTIAL, 2) for kind, n in sorted(census.kinds.items())
        }
        results["sequential_fetch_scripts_per_call"] = round(census.fetches / SEQUENTIAL, 2)
        results["sequential_by_script_per_call"] = {
            script: {
                "total": round(sum(counts.values()) / SEQUENTIAL, 2),
                **{c: round(n / SEQUENTIAL, 2) for c, n in sorted(counts.items())},
            }
            for script, counts in sorted(census.by_script.items())
        }
        print(json.dumps(results, indent=2))
    finally:
        r.close()
        fleet.stop()
        server.stop()
        procs.stop_all()


if __name__ == "__main__":
    main()
