"""CPU instructions a worker process spends per call, counted by callgrind (no timing).

Starts a private ``redis-server`` and ``toolfleet worker -p 1 -t 8`` (the tests' echo
tool) under ``valgrind --tool=callgrind --trace-children=yes --instr-atstart=no``, so
nothing is counted until asked. Then, with the worker process's instrumentation on
(``callgrind_control -i on``): ``--idle`` seconds with no call, and a burst of ``--burst``
calls. Each window's instructions (``Ir``) come from a dump (``callgrind_control -d``);
the idle rate times the burst's wall time is subtracted, and the rest divided by the
calls. Counts do not depend on the machine's load; the idle subtraction only roughly.

    .venv/bin/python bench/worker_instructions.py [--burst 500] [--idle 10]
"""

from __future__ import annotations

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
from pathlib import Path

BENCH = Path(__file__).resolve().parent
TESTS = BENCH.parent / "tests"
sys.path[:0] = [str(BENCH), str(TESTS)]

from _common import PrivateRedis, Procs  # noqa: E402

from conftest import toolfleet_command  # noqa: E402
from toolfleet.producer import ToolClient  # noqa: E402
from toolfleet.shared.naming import workers_key  # noqa: E402

ECHO = "ext_fleet_test_echo"
QUEUE = "tools.fleet-test"


def _control(*argv: str) -> None:
    subprocess.run(["callgrind_control", *argv], check=True, capture_output=True, timeout=120)


def _dumped_ir(folder: Path, pid: int, before: set[Path]) -> int:
    """Instructions in the dump files of ``pid`` written since ``before`` was listed."""
    total = 0
    for path in sorted(set(folder.glob(f"cg.{pid}*")) - before):
        found = re.search(r"^(?:summary|totals):\s*(\d+)", path.read_text(), re.MULTILINE)
        total += int(found.group(1)) if found else 0
    return total


def _dump(folder: Path, pid: int) -> int:
    before = set(folder.glob(f"cg.{pid}*"))
    _control("-d", str(pid))
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ir = _dumped_ir(folder, pid, before)
        if set(folder.glob(f"cg.{pid}*")) - before:
            time.sleep(1.0)  # let the file be written whole
            return _dumped_ir(folder, pid, before)
        time.sleep(0.2)
    raise RuntimeError(f"no dump of {pid} ({ir})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--idle", type=float, default=10.0)
    parser.add_argument("--heartbeat-s", type=float, default=5.0, help="less idle work")
    args = parser.parse_args(argv)
    procs = Procs()
    server = PrivateRedis(procs).start()
    namespace = f"irbench-{uuid.uuid4().hex[:6]}"
    folder = Path(tempfile.mkdtemp(prefix="irbench-"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])),
        "TOOLFLEET_REDIS_URL": server.url,
        "TOOLFLEET_NAMESPACE": namespace,
        "TOOLFLEET_HEARTBEAT_INTERVAL_S": str(args.heartbeat_s),
        "TOOLFLEET_WORKER_TTL_S": "30",
        "TOOLFLEET_HEALTH_DIR": str(folder / "health"),
        "TOOLFLEET_METRICS_PORT": "0",
    }
    fleet = procs.start(
        [
            "valgrind",
            "--tool=callgrind",
            "--trace-children=yes",
            "--instr-atstart=no",
            f"--callgrind-out-file={folder}/cg.%p",
            sys.executable,
            toolfleet_command(),
            "worker",
            "-p",
            "1",
            "-t",
            "8",
            "--extension",
            "fleet_tools:extension",
        ],
        env=env,
        stdout=(folder / "worker.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    r = server.client()
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and not r.zcard(workers_key(namespace, QUEUE)):
            time.sleep(1.0)
        (member,) = r.zrange(workers_key(namespace, QUEUE), 0, -1)
        pid = int(member.decode().rpartition(":")[2])
        with ToolClient(server.url, namespace=namespace) as client:
            for _ in range(20):
                assert client.call(ECHO, {"text": "w"}, timeout_s=120).ok
            _control("-i", "on", str(pid))
            _dump(folder, pid)  # from zero
            started = time.monotonic()
            time.sleep(args.idle)
            idle_ir = _dump(folder, pid)
            idle_rate = idle_ir / (time.monotonic() - started)
            started = time.monotonic()
            futures = [client.submit(ECHO, {"text": "b"}, timeout_s=900) for _ in range(args.burst)]
            statuses = Counter(future.result(timeout=960).status.value for future in futures)
            burst_ir = _dump(folder, pid)
            burst_s = time.monotonic() - started
        net = burst_ir - idle_rate * burst_s
        print(json.dumps({
            "calls": args.burst,
            "statuses": dict(statuses),
            "burst_wall_s": round(burst_s, 1),
            "idle_ir_per_s": round(idle_rate),
            "burst_ir": burst_ir,
            "ir_per_call": round(burst_ir / args.burst),
            "net_ir_per_call": round(net / args.burst),
        }, indent=2))  # fmt: skip
    finally:
        r.close()
        fleet.terminate()
        try:
            fleet.wait(timeout=60)
        except subprocess.TimeoutExpired:
            fleet.kill()
        server.stop()
        procs.stop_all()


if __name__ == "__main__":
    main()
