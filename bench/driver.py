"""The producer side of one system: run the measured phases, write a JSON report.

Started by ``compare.py`` as a subprocess (one per system and round) so that each
producer has a process of its own: its CPU time is the "producer" column, and no
library's threads or connections leak into another system's run.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import threading
import time
import tracemalloc
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import orjson
import psutil
import redis
from _common import CommandCensus, counters_delta, cpu_seconds, percentile, redis_counters

#: Seconds any single call may take before the benchmark gives up on it.
CALL_TIMEOUT_S = 60.0
#: Seconds a whole phase may take.
PHASE_TIMEOUT_S = 300.0


class BenchClient:
    """The producer API each system is driven through (bulk so arq runs one loop per phase)."""

    def call(self, n: int) -> Any:
        return self.wait_many(self.submit_many([n]))[0]

    def submit_many(self, ns: Sequence[int]) -> list[Any]:
        raise NotImplementedError

    def wait_many(self, handles: list[Any]) -> list[Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ToolfleetClient(BenchClient):
    def __init__(self, url: str) -> None:
        from bench_tools import FUNCTION

        from toolfleet.producer import ToolClient

        self.function = FUNCTION
        self.client = ToolClient(url)
        self.errors: dict[str, int] = {}

    def call(self, n: int) -> Any:
        result = self.client.call(self.function, {"n": n}, timeout_s=CALL_TIMEOUT_S)
        return self._value(result)

    def submit_many(self, ns: Sequence[int]) -> list[Any]:
        submit = self.client.submit
        return [submit(self.function, {"n": n}, timeout_s=CALL_TIMEOUT_S) for n in ns]

    def wait_many(self, handles: list[Any]) -> list[Any]:
        return [self._value(f.result()) for f in handles]

    def turn(self, ns: Sequence[int]) -> list[Any] | None:
        """One model turn through ``ToolClient.dispatch`` (None when the client has none)."""
        dispatch = getattr(self.client, "dispatch", None)
        if dispatch is None:
            return None
        tool_calls = [
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": self.function, "arguments": orjson.dumps({"n": n}).decode()},
            }
            for i, n in enumerate(ns)
        ]
        messages = dispatch(tool_calls, timeout_s=CALL_TIMEOUT_S)
        return [orjson.loads(m["content"]) for m in messages]

    def _value(self, result: Any) -> Any:
        if result.status != "ok":
            key = f"{result.status.value}: {str(result.content)[:120]}"
            self.errors[key] = self.errors.get(key, 0) + 1
        return result.content

    def close(self) -> None:
        self.client.close(wait=False)


class DramatiqClient(BenchClient):
    def __init__(self, url: str) -> None:
        import dramatiq_app

        self.actor = dramatiq_app.noop
        self.backend = dramatiq_app.backend

    def submit_many(self, ns: Sequence[int]) -> list[Any]:
        send = self.actor.send
        return [send(n) for n in ns]

    def wait_many(self, handles: list[Any]) -> list[Any]:
        timeout_ms = int(CALL_TIMEOUT_S * 1000)
        return [m.get_result(backend=self.backend, block=True, timeout=timeout_ms) for m in handles]


class CeleryClient(BenchClient):
    """``task.delay()`` and ``AsyncResult.get()``.

    Every ``AsyncResult`` is kept referenced until the client closes: one collected by
    the cyclic GC while ``delay()`` is inside the result consumer's ``SUBSCRIBE`` runs
    ``AsyncResult.__del__`` → ``UNSUBSCRIBE`` on the same pub/sub connection and
    deadlocks (seen with Celery 5.6.3, redis-py 5.3.1).
    """

    def __init__(self, url: str) -> None:
        import celery_app

        self.task = celery_app.noop
        self.keep: list[Any] = []

    def submit_many(self, ns: Sequence[int]) -> list[Any]:
        delay = self.task.delay
        handles = [delay(n) for n in ns]
        self.keep.extend(handles)
        return handles

    def wait_many(self, handles: list[Any]) -> list[Any]:
        return [r.get(timeout=CALL_TIMEOUT_S) for r in handles]


class ArqClient(BenchClient):
    def __init__(self, url: str) -> None:
        from arq import create_pool
        from arq.connections import RedisSettings
        from arq_app import POLL_DELAY_S

        self.poll_delay_s = POLL_DELAY_S
        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(create_pool(RedisSettings.from_dsn(url)))

    def submit_many(self, ns: Sequence[int]) -> list[Any]:
        async def enqueue() -> list[Any]:
            return [await self.pool.enqueue_job("noop", n) for n in ns]

        return self.loop.run_until_complete(enqueue())

    def wait_many(self, handles: list[Any]) -> list[Any]:
        async def wait() -> list[Any]:
            return [
                await job.result(timeout=CALL_TIMEOUT_S, poll_delay=self.poll_delay_s)
                for job in handles
            ]

        return self.loop.run_until_complete(wait())

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()


class RawClient(BenchClient):
    """The floor's producer: ``LPUSH`` a request, one thread ``BRPOP`` s the reply list."""

    def __init__(self, url: str) -> None:
        from raw_worker import QUEUE

        self.queue = QUEUE
        self.url = url
        self.redis = redis.Redis.from_url(url)
        self.reply_to = f"raw:reply:{uuid.uuid4().hex}"
        self.pending: dict[str, Future[Any]] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._listen, daemon=True)
        self.thread.start()

    def submit_many(self, ns: Sequence[int]) -> list[Any]:
        futures = []
        for n in ns:
            call_id = uuid.uuid4().hex
            future: Future[Any] = Future()
            with self.lock:
                self.pending[call_id] = future
            request = {"id": call_id, "n": n, "reply_to": self.reply_to}
            self.redis.lpush(self.queue, orjson.dumps(request))
            futures.append(future)
        return futures

    def wait_many(self, handles: list[Any]) -> list[Any]:
        return [f.result(timeout=CALL_TIMEOUT_S) for f in handles]

    def _listen(self) -> None:
        client = redis.Redis.from_url(self.url)
        while not self.stop.is_set():
            item = client.brpop([self.reply_to], timeout=1)
            if item is None:
                continue
            reply = orjson.loads(item[1])
            with self.lock:
                future = self.pending.pop(reply["id"], None)
            if future is not None:
                future.set_result(reply["result"])
        client.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(3)


CLIENTS: dict[str, Callable[[str], BenchClient]] = {
    "toolfleet": ToolfleetClient,
    "dramatiq": DramatiqClient,
    "celery": CeleryClient,
    "arq": ArqClient,
    "raw": RawClient,
}


# -- phases --------------------------------------------------------------------------


class Node:
    """One redis-server the meter reads: its counters (a plain client) and its process."""

    def __init__(self, client: redis.Redis, pid: int, info: dict[str, Any]) -> None:
        self.client, self.proc, self.info = client, psutil.Process(pid), info


class Meter:
    """CPU of producer / workers / Redis and Redis command counts around a phase.

    On a cluster it reads every master apart (``nodes``): the per-call figures of each go
    to ``per_master``, with the node's ``info`` (port, pid, roles), and the totals sum them.
    """

    def __init__(self, nodes: list[Node], worker_pids: list[int], cluster: bool = False) -> None:
        self.nodes, self.cluster = nodes, cluster
        self.me = psutil.Process()
        self.workers = [psutil.Process(pid) for pid in worker_pids if psutil.pid_exists(pid)]

    def snapshot(self) -> dict[str, Any]:
        return {
            "wall": time.perf_counter(),
            "producer": cpu_seconds([self.me]),
            "workers": cpu_seconds(self.workers),
            "redis": [cpu_seconds([n.proc]) for n in self.nodes],
            "counters": [redis_counters(n.client) for n in self.nodes],
        }

    def per_call(self, before: dict[str, Any], after: dict[str, Any], calls: int) -> dict[str, Any]:
        masters = []
        for i, node in enumerate(self.nodes):
            delta = counters_delta(before["counters"][i], after["counters"][i])
            masters.append(
                {
                    **node.info,
                    "cpu_us_redis": (after["redis"][i] - before["redis"][i]) / calls * 1e6,
                    "redis_cmds_per_call": delta["total"] / calls,
                    "redis_cmds_incl_scripts_per_call": sum(delta["per_command"].values()) / calls,
                    "redis_per_command": {
                        k: round(v / calls, 3) for k, v in sorted(delta["per_command"].items())
                    },
                }
            )
        per_command: dict[str, float] = {}
        for m in masters:
            for k, v in m["redis_per_command"].items():
                per_command[k] = round(per_command.get(k, 0.0) + v, 3)
        out = {
            "calls": calls,
            "wall_s": after["wall"] - before["wall"],
            "cpu_us_producer": (after["producer"] - before["producer"]) / calls * 1e6,
            "cpu_us_workers": (after["workers"] - before["workers"]) / calls * 1e6,
            "cpu_us_redis": sum(m["cpu_us_redis"] for m in masters),
            "redis_cmds_per_call": sum(m["redis_cmds_per_call"] for m in masters),
            "redis_cmds_incl_scripts_per_call": sum(
                m["redis_cmds_incl_scripts_per_call"] for m in masters
            ),
            "redis_per_command": dict(sorted(per_command.items())),
        }
        if self.cluster:
            out["per_master"] = masters
        return out


def check(values: list[Any], ns: Sequence[int]) -> int:
    """How many results differ from the expected echo of ``n``."""
    return sum(1 for v, n in zip(values, ns, strict=True) if v != n)


def phase_sequential(client: BenchClient, meter: Meter, count: int) -> dict[str, Any]:
    latencies_ms: list[float] = []
    wrong = 0
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    before = meter.snapshot()
    for i in range(count):
        if time.monotonic() > deadline:
            break
        t0 = time.perf_counter()
        value = client.call(i)
        latencies_ms.append((time.perf_counter() - t0) * 1000)
        wrong += value != i
    after = meter.snapshot()
    return {
        "p50_ms": percentile(latencies_ms, 50),
        "p95_ms": percentile(latencies_ms, 95),
        "p99_ms": percentile(latencies_ms, 99),
        "mean_ms": sum(latencies_ms) / max(1, len(latencies_ms)),
        "wrong": wrong,
        **meter.per_call(before, after, max(1, len(latencies_ms))),
    }


def phase_turns(
    client: BenchClient, turns: int, width: int, use_dispatch: bool = False
) -> dict[str, Any]:
    """``turns`` model turns of ``width`` parallel calls, one after the other.

    With ``use_dispatch`` (toolfleet), a turn is one ``ToolClient.dispatch`` of the
    model's ``tool_calls``; otherwise ``width`` submits, then waiting for all.
    """
    latencies_ms: list[float] = []
    wrong = 0
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    run = client.turn if use_dispatch and isinstance(client, ToolfleetClient) else None
    for t in range(turns):
        if time.monotonic() > deadline:
            break
        ns = list(range(t * width, (t + 1) * width))
        t0 = time.perf_counter()
        values = run(ns) if run is not None else None
        if values is None:
            run = None
            values = client.wait_many(client.submit_many(ns))
        latencies_ms.append((time.perf_counter() - t0) * 1000)
        wrong += check(values, ns)
    return {
        "api": "dispatch" if run is not None else "submit",
        "width": width,
        "turns": len(latencies_ms),
        "p50_ms": percentile(latencies_ms, 50),
        "p95_ms": percentile(latencies_ms, 95),
        "p99_ms": percentile(latencies_ms, 99),
        "wrong": wrong,
    }


def phase_throughput(client: BenchClient, meter: Meter, in_flight: int) -> dict[str, Any]:
    ns = list(range(in_flight))
    gc.collect()
    before = meter.snapshot()
    handles = client.submit_many(ns)
    submitted = time.perf_counter()
    values = client.wait_many(handles)
    after = meter.snapshot()
    stats = meter.per_call(before, after, in_flight)
    return {
        "in_flight": in_flight,
        "calls_per_s": in_flight / stats["wall_s"],
        "submit_s": submitted - before["wall"],
        "wrong": check(values, ns),
        **stats,
    }


def phase_census(client: BenchClient, urls: list[str], calls: int) -> dict[str, Any]:
    """Top-level Redis commands per call (MONITOR on each node, apart from the timed phases).

    Commands of the workers' background work (heartbeats) during the burst count too.
    """
    censuses = [CommandCensus(url).start() for url in urls]
    time.sleep(0.2)
    ns = list(range(calls))
    wrong = check(client.wait_many(client.submit_many(ns)), ns)
    time.sleep(0.2)
    top: dict[str, int] = {}
    in_scripts = 0
    for census in censuses:
        counts = census.stop()
        for k, v in counts["top_level"].items():
            top[k] = top.get(k, 0) + v
        in_scripts += sum(counts["in_scripts"].values())
    return {
        "calls": calls,
        "wrong": wrong,
        "top_level_per_call": sum(top.values()) / calls,
        "in_scripts_per_call": in_scripts / calls,
        "top_level": {k: round(v / calls, 3) for k, v in sorted(top.items())},
    }


def phase_ten_thousand(url: str, suspend_pids: list[int], count: int) -> dict[str, Any]:
    """``count`` calls in flight at once from one ToolClient: client memory, reply connections.

    The worker processes are paused (SIGSTOP) while the calls are submitted so that all
    of them are in flight together, then resumed. The client's liveness window is widened
    (``worker_ttl_s=300``) so that the paused workers' heartbeats still count; this
    setting is read only when the catalog is refreshed, not per call.
    """
    from bench_tools import FUNCTION

    from toolfleet.producer import ToolClient
    from toolfleet.shared.settings import Settings

    workers = [psutil.Process(pid) for pid in suspend_pids]
    client = ToolClient(url, settings=Settings.from_env(redis_url=url, worker_ttl_s=300.0))
    admin = redis.Redis.from_url(url)
    try:
        client.call(FUNCTION, {"n": 0})  # catalog read, connections made
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        rss_before = psutil.Process().memory_info().rss
        for w in workers:
            w.suspend()
        try:
            t0 = time.perf_counter()
            futures = [
                client.submit(FUNCTION, {"n": i}, timeout_s=240.0)
                for i in range(count)
                if time.perf_counter() - t0 < PHASE_TIMEOUT_S
            ]
            submit_s = time.perf_counter() - t0
            in_flight = client.in_flight
            traced = tracemalloc.get_traced_memory()[0] - base
            tracemalloc.stop()
            rss_delta = psutil.Process().memory_info().rss - rss_before
            names = [c.get("name", "") for c in admin.client_list()]
        finally:
            for w in workers:
                w.resume()
        t1 = time.perf_counter()
        results = [f.result() for f in futures]
        drain_s = time.perf_counter() - t1
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
        client.close(wait=False)
        admin.close()
    statuses: dict[str, int] = {}
    for r in results:
        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1
    return {
        "submitted": len(futures),
        "in_flight_peak": in_flight,
        "client_bytes_per_call": traced / max(1, in_flight),
        "client_rss_bytes_per_call": rss_delta / max(1, in_flight),
        "reply_connections": sum(1 for n in names if n == f"toolfleet-reply-{client.client_id}"),
        "client_connections": sum(1 for n in names if client.client_id in n),
        "submit_s": submit_s,
        "drain_s": drain_s,
        "drain_calls_per_s": len(results) / drain_s if drain_s else float("nan"),
        "statuses": statuses,
    }


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--system", required=True, choices=sorted(CLIENTS))
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--redis-pid", type=int, default=0, help="the single Redis's pid")
    parser.add_argument(
        "--nodes",
        default="",
        help="on a cluster: JSON list of its masters, {port, pid, roles} each",
    )
    parser.add_argument("--worker-pids", default="")
    parser.add_argument("--suspend-pids", default="")
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--in-flight", type=int, default=5000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--turn-width", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--ten-thousand", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()

    worker_pids = [int(p) for p in args.worker_pids.split(",") if p]
    if args.nodes:
        infos = orjson.loads(args.nodes)
        urls = [f"redis://127.0.0.1:{info['port']}/0" for info in infos]
        nodes = [
            Node(redis.Redis.from_url(url), info["pid"], info)
            for url, info in zip(urls, infos, strict=True)
        ]
    else:
        urls = [args.redis_url]
        nodes = [Node(redis.Redis.from_url(args.redis_url), args.redis_pid, {})]
    meter = Meter(nodes, worker_pids, cluster=bool(args.nodes))
    client = CLIENTS[args.system](args.redis_url)
    report: dict[str, Any] = {"system": args.system, "pid": os.getpid()}
    try:
        for i in range(30):
            client.call(i)
        client.wait_many(client.submit_many(range(args.warmup)))
        report["sequential"] = phase_sequential(client, meter, args.sequential)
        report["turn"] = phase_turns(client, args.turns, args.turn_width, use_dispatch=True)
        if isinstance(client, ToolfleetClient):
            report["turn_submit"] = phase_turns(client, args.turns, args.turn_width)
        report["throughput"] = phase_throughput(client, meter, args.in_flight)
        report["census"] = phase_census(client, urls, min(1000, args.in_flight))
        if isinstance(client, ToolfleetClient):
            report["errors"] = client.errors
    finally:
        client.close()
    if args.ten_thousand:
        suspend = [int(p) for p in args.suspend_pids.split(",") if p]
        report["ten_thousand"] = phase_ten_thousand(args.redis_url, suspend, args.ten_thousand)
    args.out.write_text(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
