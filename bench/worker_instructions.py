"""CPU instructions and Redis commands a worker side spends per call (callgrind; no timing).

One run measures two systems the same way, each on its own private ``redis-server``:

- ``toolfleet``: ``toolfleet worker -p 1 -t 8`` serving the tests' echo tool;
- ``dramatiq``: ``dramatiq dramatiq_app -p 1 -t 8`` (Dramatiq + Results, the no-op actor
  of ``bench/apps/dramatiq_app.py``, as ``compare.py`` runs it).

Each worker side runs under ``valgrind --tool=callgrind --trace-children=yes
--instr-atstart=no``, so nothing is counted until asked. After a warm-up the producer
closes, every process of the worker tree gets its instrumentation switched on
(``callgrind_control -i on PID``) and is dumped (``-d``) at the edges of two windows:
``--idle`` seconds with no call, then a burst of ``--burst`` calls. The tree's idle rate
times the burst's wall time is subtracted from the burst's instructions (``Ir``) and the
rest divided by the calls. Redis commands come from ``INFO commandstats`` deltas on the
private server: per call over the burst (producer and worker side together, both
systems alike), and per second over the idle window (the worker side alone; no
producer is connected). Counts do not depend on the machine's load; the idle
subtraction only roughly.

    .venv/bin/python bench/worker_instructions.py [--burst 400] [--idle 10] [--only toolfleet]
"""

from __future__ import annotations

import abc
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
TESTS = BENCH.parent / "tests"
sys.path[:0] = [str(BENCH), str(BENCH / "apps"), str(TESTS)]

import psutil  # noqa: E402
from _common import APPS_DIR, PrivateRedis, Procs, counters_delta, redis_counters  # noqa: E402

from conftest import toolfleet_command  # noqa: E402
from toolfleet.producer import ToolClient  # noqa: E402
from toolfleet.shared.naming import workers_key  # noqa: E402

ECHO = "ext_fleet_test_echo"
QUEUE = "tools.fleet-test"
READY_KEY = "bench:ready"
SYSTEMS = ("toolfleet", "dramatiq")


def _control(*argv: str) -> None:
    subprocess.run(["callgrind_control", *argv], check=True, capture_output=True, timeout=120)


def _dumped_ir(folder: Path, pid: int, before: set[Path]) -> int:
    """Instructions in the dump files of ``pid`` written since ``before`` was listed."""
    total = 0
    for path in sorted(set(folder.glob(f"cg.{pid}*")) - before):
        found = re.search(r"^(?:summary|totals):\s*(\d+)", path.read_text(), re.MULTILINE)
        total += int(found.group(1)) if found else 0
    return total


def _dump(folder: Path, pids: list[int]) -> dict[int, int]:
    """Dump every process of ``pids``; instructions of each since its previous dump."""
    before = {pid: set(folder.glob(f"cg.{pid}*")) for pid in pids}
    for pid in pids:
        _control("-d", str(pid))
    counts = {}
    for pid in pids:
        deadline = time.monotonic() + 180
        while not set(folder.glob(f"cg.{pid}*")) - before[pid]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no dump of {pid}")
            time.sleep(0.2)
    time.sleep(1.0)  # let the files be written whole
    for pid in pids:
        counts[pid] = _dumped_ir(folder, pid, before[pid])
    return counts


def _tree(root: subprocess.Popen[bytes]) -> list[int]:
    """Pids of the worker tree under valgrind (root first)."""
    parent = psutil.Process(root.pid)
    return [parent.pid, *(child.pid for child in parent.children(recursive=True))]


class Side(abc.ABC):
    """How to start, drive and address one system's worker side."""

    name = ""

    def __init__(self, url: str, namespace: str) -> None:
        self.url = url
        self.namespace = namespace

    @abc.abstractmethod
    def argv(self) -> list[str]:
        """The worker side's command line."""

    @abc.abstractmethod
    def env(self, folder: Path) -> dict[str, str]:
        """Its environment (logs and health files under ``folder``)."""

    @abc.abstractmethod
    def ready(self, r: Any) -> bool:
        """Whether it serves, read from Redis ``r``."""

    @abc.abstractmethod
    def burst(self, calls: int) -> Counter[str]:
        """Send ``calls`` calls at once; their statuses."""

    def warm(self, calls: int) -> None:
        self.burst(calls)

    def close(self) -> None:  # noqa: B027 - an optional hook: nothing to close by default
        """Release what :meth:`burst` holds (a client); nothing by default."""


class Toolfleet(Side):
    name = "toolfleet"

    def __init__(self, url: str, namespace: str, heartbeat_s: float) -> None:
        super().__init__(url, namespace)
        self.heartbeat_s = heartbeat_s

    def argv(self) -> list[str]:
        return [sys.executable, toolfleet_command(), "worker", "-p", "1", "-t", "8",
                "--extension", "fleet_tools:extension"]  # fmt: skip

    def env(self, folder: Path) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
            "TOOLFLEET_REDIS_URL": self.url,
            "TOOLFLEET_NAMESPACE": self.namespace,
            "TOOLFLEET_HEARTBEAT_INTERVAL_S": str(self.heartbeat_s),
            "TOOLFLEET_WORKER_TTL_S": "30",
            "TOOLFLEET_HEALTH_DIR": str(folder / "health"),
            "TOOLFLEET_METRICS_PORT": "0",
        }

    def ready(self, r: Any) -> bool:
        return bool(r.zcard(workers_key(self.namespace, QUEUE)))

    def burst(self, calls: int) -> Counter[str]:
        with ToolClient(self.url, namespace=self.namespace) as client:
            futures = [client.submit(ECHO, {"text": "b"}, timeout_s=900) for _ in range(calls)]
            return Counter(future.result(timeout=960).status.value for future in futures)


class Dramatiq(Side):
    name = "dramatiq"

    def argv(self) -> list[str]:
        script = Path(sys.executable).parent / "dramatiq"
        return [sys.executable, str(script), "dramatiq_app", "-p", "1", "-t", "8"]

    def env(self, folder: Path) -> dict[str, str]:
        path = [str(APPS_DIR), str(BENCH), os.environ.get("PYTHONPATH", "")]
        return {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, path)),
            "BENCH_REDIS_URL": self.url,
            "PYTHONUNBUFFERED": "1",
        }

    def ready(self, r: Any) -> bool:
        return bool(r.scard(READY_KEY))

    def burst(self, calls: int) -> Counter[str]:
        os.environ["BENCH_REDIS_URL"] = self.url
        import dramatiq_app  # the producer side of the same app (its broker is this URL)

        send = dramatiq_app.noop.send
        messages = [send(n) for n in range(calls)]
        statuses: Counter[str] = Counter()
        for n, message in enumerate(messages):
            value = message.get_result(backend=dramatiq_app.backend, block=True, timeout=960_000)
            statuses["ok" if value == n else "wrong"] += 1
        return statuses

    def close(self) -> None:
        if "dramatiq_app" in sys.modules:
            app = sys.modules.pop("dramatiq_app")
            app.broker.close()
            app.backend.client.close()


def measure(side: Side, server: PrivateRedis, procs: Procs, args: argparse.Namespace) -> dict:
    """Run ``side`` under callgrind on ``server``; its figures per call and at idle."""
    folder = Path(tempfile.mkdtemp(prefix=f"irbench-{side.name}-"))
    root = procs.start(
        [
            "valgrind",
            "--tool=callgrind",
            "--trace-children=yes",
            "--instr-atstart=no",
            f"--callgrind-out-file={folder}/cg.%p",
            *side.argv(),
        ],
        env=side.env(folder),
        cwd=APPS_DIR,
        stdout=(folder / "worker.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    r = server.client()
    try:
        deadline = time.monotonic() + 600
        while not side.ready(r):
            if time.monotonic() > deadline or root.poll() is not None:
                tail = (folder / "worker.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{side.name}: no worker ready:\n{tail}")
            time.sleep(1.0)
        side.warm(20)
        time.sleep(2.0)  # let the warm-up's last completions land
        pids = _tree(root)
        for pid in pids:
            _control("-i", "on", str(pid))
        _dump(folder, pids)  # from zero
        stats_before = redis_counters(r)
        started = time.monotonic()
        time.sleep(args.idle)
        idle = _dump(folder, pids)
        idle_s = time.monotonic() - started
        idle_commands = counters_delta(stats_before, redis_counters(r))
        stats_before = redis_counters(r)
        started = time.monotonic()
        statuses = side.burst(args.burst)
        burst = _dump(folder, pids)
        burst_s = time.monotonic() - started
        burst_commands = counters_delta(stats_before, redis_counters(r))
    finally:
        r.close()
        side.close()
        procs.stop(root, grace_s=60)
    idle_ir = sum(idle.values())
    idle_rate = idle_ir / idle_s
    burst_ir = sum(burst.values())
    net = burst_ir - idle_rate * burst_s
    per_command = burst_commands["per_command"]
    return {
        "calls": args.burst,
        "statuses": dict(statuses),
        "processes": len(pids),
        "burst_wall_s": round(burst_s, 1),
        "idle_ir_per_s": round(idle_rate),
        "burst_ir": burst_ir,
        "burst_ir_by_pid": {str(pid): ir for pid, ir in burst.items()},
        "net_ir_per_call": round(net / args.burst),
        "redis_commands_per_call": round(burst_commands["total"] / args.burst, 2),
        "redis_commands_by_name_per_call": {
            k: round(v / args.burst, 2) for k, v in sorted(per_command.items())
        },
        "idle_redis_commands_per_s": round(idle_commands["total"] / idle_s, 2),
        "idle_redis_commands_by_name": idle_commands["per_command"],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=400)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--heartbeat-s", type=float, default=5.0, help="less idle work")
    parser.add_argument("--only", choices=SYSTEMS, action="append", help="repeatable")
    args = parser.parse_args(argv)
    procs = Procs()
    namespace = f"irbench-{uuid.uuid4().hex[:6]}"
    makers: dict[str, Callable[[str], Side]] = {
        "toolfleet": lambda url: Toolfleet(url, namespace, args.heartbeat_s),
        "dramatiq": lambda url: Dramatiq(url, namespace),
    }
    report: dict[str, Any] = {}
    try:
        for name in args.only or SYSTEMS:
            server = PrivateRedis(procs).start()
            try:
                report[name] = measure(makers[name](server.url), server, procs, args)
            finally:
                server.stop()
            print(f"{name}: {json.dumps(report[name])}", file=sys.stderr, flush=True)
    finally:
        procs.stop_all()
    if "toolfleet" in report and "dramatiq" in report:
        tf, dq = report["toolfleet"], report["dramatiq"]
        report["ratio"] = {
            "ir_per_call": round(tf["net_ir_per_call"] / dq["net_ir_per_call"], 2),
            "redis_commands_per_call": round(
                tf["redis_commands_per_call"] / dq["redis_commands_per_call"], 2
            ),
            "idle_redis_commands_per_s": round(
                tf["idle_redis_commands_per_s"] / max(dq["idle_redis_commands_per_s"], 0.01), 2
            ),
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
