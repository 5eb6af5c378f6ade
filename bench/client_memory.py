"""Client memory per call in flight: 10,000 calls from ToolClient, then from AsyncToolClient.

    .venv/bin/python bench/client_memory.py [--calls 10000] [--top 15] [--out FILE]

Starts a private embedded Redis (a unix socket, no TCP port, no persistence) and a real
fleet (``toolfleet worker -p 1`` with the bench extension ``bench_tools``), pauses the
worker processes (SIGSTOP) so that every call stays in flight, and for each client in
turn submits ``--calls`` calls of the no-op tool, then resumes the workers and checks
that every call was answered ``ok`` with its own argument. Prints a table and writes
``bench/results/client-memory-<short commit>.json``. Needs the demo extra (the server).

What is counted, per client: the bytes ``tracemalloc`` traces as allocated and still
alive (after ``gc.collect()``) once every call is submitted and its request is in Redis
(the queue's ``.msgs`` hash holds them all, so no call still waits in the client's
outgoing batch), minus the bytes traced before the first submit, divided by the calls
in flight. That is everything the process holds for the calls: the futures, the
pending-call records, the id table, the deadline heap, timers, tasks, callbacks, and
whatever the client's threads or tasks keep meanwhile. Not counted: what the benchmark
itself holds, which it allocates before tracing starts and reports apart (the list the
futures go in, preallocated, and the argument dicts, built beforehand); allocations by C
libraries outside Python's allocators (hiredis buffers, the kernel's socket buffers).

The figures are counts of bytes, not timings: the machine's load does not change them.
Before measuring, each client makes one call and a burst of calls answered by the
fleet, so that what is allocated once per client (connections, threads, the catalog,
lazily imported modules, caches) is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
APPS = BENCH / "apps"
sys.path[:0] = [str(APPS)]

from bench_tools import FUNCTION  # noqa: E402

from toolfleet.producer import AsyncToolClient, ToolClient  # noqa: E402
from toolfleet.shared.naming import (  # noqa: E402
    default_queue_for,
    fleet_namespace,
    queue_msgs_key,
    workers_key,
)
from toolfleet.shared.settings import Settings  # noqa: E402
from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis  # noqa: E402

NAMESPACE = "tfmem"
QUEUE = default_queue_for("bench")
#: The calls' budget: far longer than the measurement, so that none times out meanwhile.
CALL_TIMEOUT_S = 600.0
#: Calls answered by the fleet before measuring (one-time allocations of a client).
WARM_CALLS = 500
#: The target of the issue: bytes per call in flight, both clients.
TARGET_BYTES = 2048


# -- the fleet -------------------------------------------------------------------------


def _toolfleet_command() -> str:
    beside = Path(sys.executable).parent / "toolfleet"
    return str(beside) if beside.exists() else shutil.which("toolfleet") or "toolfleet"


def _children(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (read from ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def fleet(url: str, log_path: Path) -> Iterator[list[int]]:
    """A ``toolfleet worker -p 1`` serving the bench tool; yields its worker processes' pids."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(APPS), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "TOOLFLEET_REDIS_URL": url,
        "TOOLFLEET_NAMESPACE": NAMESPACE,
        "TOOLFLEET_METRICS_PORT": "0",
        "TOOLFLEET_HEALTH_DIR": str(log_path.parent / "health"),
    }
    argv = [_toolfleet_command(), "worker", "-p", "1", "-Q", QUEUE,
            "--extension", "bench_tools:extension"]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=APPS, start_new_session=True
        )
    try:
        admin = redis.Redis.from_url(url)
        deadline = time.monotonic() + 60
        key = workers_key(fleet_namespace(NAMESPACE), QUEUE)
        while admin.zcount(key, time.time() - 10, "+inf") < 1:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fleet did not start:\n{log_path.read_text()[-2000:]}")
            time.sleep(0.1)
        admin.close()
        workers = _children(process.pid)
        if not workers:
            raise RuntimeError("no worker process under the supervisor")
        yield workers
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGCONT)
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


# -- measuring -------------------------------------------------------------------------


class Holder:
    """What the benchmark itself holds, made before tracing: argument dicts, the futures' list."""

    def __init__(self, calls: int) -> None:
        self.arguments = [{"n": i} for i in range(calls)]
        self.futures: list[Any] = [None] * calls
        self.list_bytes = sys.getsizeof(self.futures)
        self.arguments_bytes = sum(
            sys.getsizeof(a) + (sys.getsizeof(a["n"]) if a["n"] > 256 else 0)
            for a in self.arguments
        )


class Trace:
    """The bytes traced between :meth:`start` and :meth:`stop` (still alive at the stop)."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.base = 0
        self.traced = 0
        self.sites: list[str] = []

    def start(self) -> None:
        gc.collect()
        tracemalloc.start(25 if self.top else 1)
        self.base = tracemalloc.get_traced_memory()[0]

    def stop(self) -> None:
        gc.collect()
        self.traced = tracemalloc.get_traced_memory()[0] - self.base
        if self.top:
            snapshot = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__)]
            )
            stats = snapshot.statistics("traceback")[: self.top]
            self.sites = [_site(s) for s in stats]
        tracemalloc.stop()


def _site(stat: tracemalloc.Statistic) -> str:
    """One allocation site: its bytes, blocks and the innermost frames of its traceback."""
    innermost = list(stat.traceback)[-4:]
    path = " <- ".join(f"{Path(f.filename).name}:{f.lineno}" for f in reversed(innermost))
    return f"{stat.size:>10,} B {stat.count:>7,} blocks  {path}"


def _queued(admin: redis.Redis) -> int:
    """Messages the bench queue holds (queued, prefetched or running)."""
    return int(admin.hlen(queue_msgs_key(NAMESPACE, QUEUE)))


def _wait_empty(admin: redis.Redis, timeout_s: float = 60) -> None:
    """Until the fleet has acknowledged every earlier message (the queue counts from 0)."""
    deadline = time.monotonic() + timeout_s
    while _queued(admin):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the queue still holds {_queued(admin)} earlier messages")
        time.sleep(0.05)


def _wait_published(admin: redis.Redis, calls: int, timeout_s: float = 300) -> None:
    """Until the queue holds every call (none is left in the client's outgoing batch)."""
    deadline = time.monotonic() + timeout_s
    while _queued(admin) < calls:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {_queued(admin)} of {calls} calls reached Redis")
        time.sleep(0.05)


def _settings(url: str) -> Settings:
    # the paused workers' heartbeats still count as live (read at catalog refreshes only)
    return Settings.from_env(redis_url=url, namespace=NAMESPACE, worker_ttl_s=3600.0)


def _report(kind: str, holder: Holder, trace: Trace, in_flight: int, results: list[Any],
            submit_s: float) -> dict[str, Any]:  # fmt: skip
    statuses: dict[str, int] = {}
    wrong = 0
    for n, result in enumerate(results):
        statuses[result.status.value] = statuses.get(result.status.value, 0) + 1
        wrong += result.status.value == "ok" and result.content != n
    return {
        "client": kind,
        "calls": len(results),
        "in_flight": in_flight,
        "client_bytes": trace.traced,
        "client_bytes_per_call": round(trace.traced / max(1, in_flight), 1),
        "below_target": trace.traced / max(1, in_flight) < TARGET_BYTES,
        "benchmark_bytes_not_counted": {
            "futures_list": holder.list_bytes,
            "argument_dicts": holder.arguments_bytes,
        },
        "submit_s_under_tracemalloc": round(submit_s, 2),
        "statuses": statuses,
        "wrong_values": wrong,
        "top_sites": trace.sites,
    }


def measure_sync(url: str, workers: list[int], calls: int, top: int) -> dict[str, Any]:
    """``calls`` calls in flight from one ``ToolClient``."""
    admin = redis.Redis.from_url(url)
    client = ToolClient(url, settings=_settings(url))
    try:
        client.call(FUNCTION, {"n": 0}, timeout_s=60)
        warm = [client.submit(FUNCTION, {"n": i}, timeout_s=60) for i in range(WARM_CALLS)]
        for f in warm:
            f.result()
        del warm
        _wait_empty(admin)
        holder, trace = Holder(calls), Trace(top)
        futures, arguments, submit = holder.futures, holder.arguments, client.submit
        _signal_all(workers, signal.SIGSTOP)
        try:
            trace.start()
            t0 = time.perf_counter()
            for i in range(calls):
                futures[i] = submit(FUNCTION, arguments[i], timeout_s=CALL_TIMEOUT_S)
            submit_s = time.perf_counter() - t0
            _wait_published(admin, calls)
            in_flight = client.in_flight
            trace.stop()
        finally:
            if tracemalloc.is_tracing():
                tracemalloc.stop()
            _signal_all(workers, signal.SIGCONT)
        results = [f.result(timeout=CALL_TIMEOUT_S) for f in futures]
    finally:
        client.close(wait=False)
        admin.close()
    return _report("ToolClient", holder, trace, in_flight, results, submit_s)


def measure_async(url: str, workers: list[int], calls: int, top: int) -> dict[str, Any]:
    """``calls`` calls in flight from one ``AsyncToolClient`` (submitted one after the other)."""

    async def run() -> dict[str, Any]:
        admin = redis.Redis.from_url(url)
        client = AsyncToolClient(url, settings=_settings(url))
        try:
            await client.call(FUNCTION, {"n": 0}, timeout_s=60)
            warm = [
                await client.submit(FUNCTION, {"n": i}, timeout_s=60) for i in range(WARM_CALLS)
            ]
            await asyncio.gather(*warm)
            del warm
            _wait_empty(admin)
            holder, trace = Holder(calls), Trace(top)
            futures, arguments, submit = holder.futures, holder.arguments, client.submit
            _signal_all(workers, signal.SIGSTOP)
            try:
                trace.start()
                t0 = time.perf_counter()
                for i in range(calls):
                    futures[i] = await submit(FUNCTION, arguments[i], timeout_s=CALL_TIMEOUT_S)
                submit_s = time.perf_counter() - t0
                await _until(lambda: _queued(admin) >= calls)
                in_flight = client.in_flight
                trace.stop()
            finally:
                if tracemalloc.is_tracing():
                    tracemalloc.stop()
                _signal_all(workers, signal.SIGCONT)
            results = await asyncio.wait_for(asyncio.gather(*futures), CALL_TIMEOUT_S)
        finally:
            await client.close(wait=False)
            admin.close()
        return _report("AsyncToolClient", holder, trace, in_flight, results, submit_s)

    return asyncio.run(run())


async def _until(condition: Callable[[], Any], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("the calls did not all reach Redis")
        await asyncio.sleep(0.05)


# -- the report ------------------------------------------------------------------------


def _git(*argv: str) -> str:
    done = subprocess.run(["git", *argv], cwd=BENCH.parent, capture_output=True, text=True)
    return done.stdout.strip()


def _commit() -> str:
    head = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--", "producer", "shared", "bench/client_memory.py")
    return f"{head}-dirty" if dirty else head


def _table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| client | calls in flight | client bytes | bytes per call | < 2,048 B | statuses |",
        "| --- | ---: | ---: | ---: | :-: | --- |",
    ]
    for r in runs:
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        wrong = f", {r['wrong_values']} wrong values" if r["wrong_values"] else ""
        lines.append(
            f"| {r['client']} | {r['in_flight']:,} | {r['client_bytes']:,} | "
            f"{r['client_bytes_per_call']:,.0f} | {'yes' if r['below_target'] else '**no**'} | "
            f"{statuses}{wrong} |"
        )
    return "\n".join(lines)


Measure = Callable[[str, list[int], int, int], dict[str, Any]]
CLIENTS: dict[str, Measure] = {"sync": measure_sync, "async": measure_async}


def main(argv: list[str] | None = None) -> int:
    """Run the measurement; 0 when every call came back ``ok`` with its own value."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000, help="calls in flight per client")
    parser.add_argument("--clients", default="sync,async", help="sync, async or both")
    parser.add_argument("--top", type=int, default=0, help="print the N largest allocation sites")
    parser.add_argument("--out", type=Path, default=None, help="JSON path (default: results/)")
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="toolfleet-memory-") as tmp,
        EmbeddedRedis() as server,
        fleet(server.url, Path(tmp) / "worker.log") as workers,
    ):
        for kind in args.clients.split(","):
            run = CLIENTS[kind.strip()](server.url, workers, args.calls, args.top)
            runs.append(run)
            for line in run["top_sites"]:
                print(f"  {run['client']}: {line}")
    commit = _commit()
    data = {
        "meta": {
            "commit": commit,
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "python": platform.python_version(),
            "calls": args.calls,
            "what": "tracemalloc bytes alive per call in flight (counts, load-independent)",
        },
        "runs": runs,
    }
    out = args.out or BENCH / "results" / f"client-memory-{commit}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(_table(runs))
    print(f"\nwrote {out}")
    ok = all(r["statuses"] == {"ok": r["calls"]} and not r["wrong_values"] for r in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
