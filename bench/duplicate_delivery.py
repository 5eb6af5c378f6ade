"""Duplicate deliveries under load: is every call's one reply on its reply list in time?

Starts ``toolfleet worker -p 2 -t 4`` with the tests' promise tools (``tests/promise_tools.py``:
``ext_promise_side_effect`` counts its runs in a Redis key, then sleeps) on the Redis of
``TOOLFLEET_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``) under a throwaway namespace,
with the tests' heartbeat settings (0.5 s interval, 3 s worker TTL), and ``--load`` busy-loop
processes of its own beside it (stopped at the end). Then ``--runs`` runs, ``--concurrency``
at a time; each publishes one request twice (the two messages at once, one after the other,
or the second up to 0.5 s later) and waits for its reply:

- ``raw`` runs publish Dramatiq messages themselves and read the reply list with ``LRANGE``
  (what ``tests/test_exactly_once.py`` does);
- ``client`` runs go through a :class:`~toolfleet.producer.ToolClient` whose publisher sends
  every message twice, and wait for the call's future.

A run is *clean* when exactly one ``ok`` reply arrived within ``--within`` seconds of
publishing (default 5), the tool ran once and the Redis reply list holds nothing more. Any
other run is printed with what Redis holds for it (outcome, claim, cancel marker, the reply
list and its TTL, the run count) and the worker log lines naming it; a missing reply is
looked for again until 15 s after publishing (``late``: slow, not lost). The last line
gives the counts::

    python bench/duplicate_delivery.py [--runs 600] [--concurrency 6] [--load 2] [--within 5]

Exit status 1 when a run was not clean.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import redis
from _process import load_average, stop_process

from toolfleet.producer import ToolClient
from toolfleet.producer.publish import encode_message
from toolfleet.shared.naming import cancel_key, claim_key, outcome_key, workers_key
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, new_call_id

TESTS = Path(__file__).resolve().parent.parent / "tests"
QUEUE = "tools.promise"
FUNCTION = "ext_promise_side_effect"
#: Seconds after publishing a missing reply is still looked for (then it is lost, not late).
LOST_AFTER_S = 15.0
#: How the two messages of a run are published.
ORDERS = ("together", "one-then-other", "second-later", "refetch", "burst")


def _burn(stop_at: float) -> None:
    """Spin until ``stop_at`` (epoch seconds): one core of background load."""
    x = 0
    while time.time() < stop_at:
        for _ in range(10_000):
            x += 1


def _enqueue(r: redis.Redis, namespace: str, request: ToolCallRequest) -> str:
    """Publish one Dramatiq message carrying ``request`` (the test's raw duplicate); its id."""
    redis_id, body = encode_message(QUEUE, request)
    pipe = r.pipeline(transaction=False)
    pipe.hset(f"{namespace}:{QUEUE}.msgs", redis_id, body)
    pipe.rpush(f"{namespace}:{QUEUE}", redis_id)
    pipe.execute()
    return redis_id


def _results(r: redis.Redis, reply_to: str) -> list[ReplyEnvelope]:
    return [
        envelope
        for envelope in (ReplyEnvelope.decode(item) for item in r.lrange(reply_to, 0, -1))
        if envelope.type == "result"
    ]


class Stress:
    """The fleet, the load and the counts of one stress session."""

    def __init__(
        self,
        redis_url: str,
        namespace: str,
        log_path: Path,
        within_s: float,
        seconds: list[float],
    ) -> None:
        self.redis_url = redis_url
        self.seconds = seconds
        self.namespace = namespace
        self.log_path = log_path
        self.within_s = within_s
        self.counts: Counter[str] = Counter()
        self.reply_s: list[float] = []
        self.reports: list[str] = []
        self._lock = threading.Lock()

    def record(self, mode: str, kind: str, report: str = "", reply_s: float | None = None) -> None:
        with self._lock:
            self.counts[f"{mode}:{kind}"] += 1
            if reply_s is not None:
                self.reply_s.append(reply_s)
            if report:
                self.reports.append(report)
                print(report, flush=True)

    def state(self, r: redis.Redis, request: ToolCallRequest, runs_key: str) -> str:
        """What Redis holds for ``request`` (for the report of a run that was not clean)."""
        ns = self.namespace
        outcome = r.get(outcome_key(ns, request.id))
        status = None
        if outcome is not None:
            recorded = ReplyEnvelope.decode(outcome).result
            status = recorded.status.value if recorded is not None else "?"
        log = [
            line
            for line in self.log_path.read_text(errors="replace").splitlines()
            if request.id in line
        ]
        return (
            f"  outcome={status} claim={r.get(claim_key(ns, request.id))!r} "
            f"cancel={r.get(cancel_key(ns, request.id))!r} runs={r.get(runs_key)!r} "
            f"reply_list_len={r.llen(request.reply_to)} reply_list_ttl={r.ttl(request.reply_to)}"
            f"\n  workers={r.zrange(workers_key(ns, QUEUE), 0, -1, withscores=True)} "
            f"now={time.time():.3f}\n  log:\n    " + "\n    ".join(log[-20:])
        )

    def raw_run(self, r: redis.Redis, index: int) -> None:
        """One run through raw messages and the reply list (``LRANGE``)."""
        ns = self.namespace
        runs_key = f"{ns}:runs:{uuid.uuid4().hex}"
        request = ToolCallRequest(
            id=new_call_id(),
            function=FUNCTION,
            arguments={"key": runs_key, "seconds": random.choice(self.seconds)},
            reply_to=f"{ns}:reply:dup-{uuid.uuid4().hex}",
            deadline=time.time() + 30,
            timeout_s=30,
        )
        order = ORDERS[index % len(ORDERS)]
        published = time.monotonic()
        if order in ("together", "burst"):
            pipe_threads = [
                threading.Thread(target=_enqueue, args=(r, ns, request))
                for _ in range(2 if order == "together" else 6)
            ]
            for thread in pipe_threads:
                thread.start()
            for thread in pipe_threads:
                thread.join()
        elif order == "refetch":  # the same message again while it runs (a requeue), and more
            first = _enqueue(r, ns, request)
            give_up = time.monotonic() + 5
            while r.get(runs_key) is None and time.monotonic() < give_up:
                time.sleep(0.005)
            for _ in range(2):
                r.lpush(f"{ns}:{QUEUE}", first)
            _enqueue(r, ns, request)
        else:
            _enqueue(r, ns, request)
            if order == "second-later":
                time.sleep(random.uniform(0.0, 0.5))
            _enqueue(r, ns, request)
        try:
            self._await_raw(r, request, runs_key, published, order)
        finally:
            r.delete(runs_key, request.reply_to)

    def _await_raw(
        self,
        r: redis.Redis,
        request: ToolCallRequest,
        runs_key: str,
        published: float,
        order: str,
    ) -> None:
        results = _results(r, request.reply_to)
        while not results and time.monotonic() - published < self.within_s:
            time.sleep(0.02)
            results = _results(r, request.reply_to)
        waited = time.monotonic() - published
        if not results:
            snapshot = self.state(r, request, runs_key)
            while not results and time.monotonic() - published < LOST_AFTER_S:
                time.sleep(0.05)
                results = _results(r, request.reply_to)
            kind = "late" if results else "lost"
            self.record(
                f"raw/{order}",
                kind,
                f"raw {kind} ({order}) call {request.id}: no reply {waited:.2f} s after "
                f"publishing; at that moment:\n{snapshot}",
            )
            return
        time.sleep(0.3)  # a second reply, if any, would land now (the other delivery ran)
        results = _results(r, request.reply_to)
        statuses = [e.result.status.value for e in results if e.result is not None]
        if statuses != ["ok"] or r.get(runs_key) != b"1":
            self.record(
                f"raw/{order}",
                "wrong",
                f"raw wrong ({order}) call {request.id}: replies {statuses}\n"
                + self.state(r, request, runs_key),
            )
            return
        self.record(f"raw/{order}", "clean", reply_s=waited)

    def client_run(self, client: ToolClient, r: redis.Redis) -> None:
        """One run through a client whose publisher sends every message twice."""
        runs_key = f"{self.namespace}:runs:{uuid.uuid4().hex}"
        arguments = {"key": runs_key, "seconds": random.choice(self.seconds)}
        published = time.monotonic()
        future = client.submit(FUNCTION, arguments, timeout_s=LOST_AFTER_S)
        try:
            result = future.result(timeout=self.within_s)
        except TimeoutError:
            result = None
        waited = time.monotonic() - published
        try:
            if result is None:
                final = future.result(timeout=LOST_AFTER_S + 5)
                kind = "late" if final.worker is not None and final.ok else "lost"
                self.record(
                    "client",
                    kind,
                    f"client {kind} call {future.call_id}: unresolved {waited:.2f} s after "
                    f"publishing; then {final.status.value} (worker={final.worker})",
                )
                return
            time.sleep(0.3)
            if not result.ok or r.get(runs_key) != b"1":
                self.record(
                    "client",
                    "wrong",
                    f"client wrong call {future.call_id}: {result.status.value} "
                    f"{result.content!r} runs={r.get(runs_key)!r}",
                )
                return
            self.record("client", "clean", reply_s=waited)
        finally:
            r.delete(runs_key)


def _doubling(client: ToolClient) -> None:
    """Make ``client`` publish every message twice (a duplicate delivery of each call)."""
    publisher = client._publisher  # noqa: SLF001 - the stress wraps the client's own publisher
    publish_many: Callable[..., list[Any]] = publisher.publish_many

    def twice(items: Sequence[tuple[str, ToolCallRequest]], *args: Any) -> list[Any]:
        outcomes = publish_many([*items, *items], *args)
        return outcomes[: len(items)]

    publisher.publish_many = twice  # type: ignore[method-assign]


def _wait_ready(r: redis.Redis, namespace: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the worker exited with {process.returncode}")
        if r.zcount(workers_key(namespace, QUEUE), time.time() - 3, "+inf") >= 2:
            return
        time.sleep(0.2)
    raise SystemExit("the fleet was not ready in 120 s")


def main() -> None:
    """Run the stress session and print the counts (exit 1 when a run was not clean)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=600, help="runs in all (half raw, half client)")
    parser.add_argument("--concurrency", type=int, default=6, help="runs at a time")
    parser.add_argument("--load", type=int, default=2, help="busy-loop processes beside the fleet")
    parser.add_argument("--within", type=float, default=5.0, help="seconds a reply may take")
    parser.add_argument("--mode", choices=["both", "raw", "client"], default="both")
    parser.add_argument(
        "--seconds", default="0,0.01,0.1,0.3,1", help="the tool's sleeps to pick from (s, comma)"
    )
    args = parser.parse_args()
    redis_url = os.environ.get("TOOLFLEET_REDIS_URL", "redis://127.0.0.1:6379/0")
    namespace = f"dup-bench-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
            "TOOLFLEET_REDIS_URL": redis_url,
            "TOOLFLEET_NAMESPACE": namespace,
            "TOOLFLEET_HEARTBEAT_INTERVAL_S": "0.5",
            "TOOLFLEET_WORKER_TTL_S": "3",
            "TOOLFLEET_METRICS_PORT": "0",
            "TOOLFLEET_HEALTH_DIR": f"{tmp}/health",
        }
        argv = [
            os.path.join(os.path.dirname(sys.executable), "toolfleet"),
            "worker", "-p", "2", "-t", "4",
            "--extension", "promise_tools:extension",
        ]  # fmt: skip
        log_path = Path(tmp) / "worker.log"
        log = log_path.open("wb")
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        r = redis.Redis.from_url(redis_url)
        burners: list[multiprocessing.Process] = []
        seconds = [float(x) for x in args.seconds.split(",")]
        stress = Stress(redis_url, namespace, log_path, args.within, seconds)
        started = time.monotonic()
        try:
            _wait_ready(r, namespace, process)
            stop_at = time.time() + 3600
            burners = [
                multiprocessing.Process(target=_burn, args=(stop_at,), daemon=True)
                for _ in range(args.load)
            ]
            for burner in burners:
                burner.start()
            modes = {"both": ["raw", "client"], "raw": ["raw"], "client": ["client"]}[args.mode]
            with ToolClient(redis_url, namespace=namespace) as client:
                _doubling(client)
                with ThreadPoolExecutor(args.concurrency) as pool:
                    jobs = []
                    for index in range(args.runs):
                        mode = modes[index % len(modes)]
                        if mode == "raw":
                            jobs.append(pool.submit(stress.raw_run, r, index // len(modes)))
                        else:
                            jobs.append(pool.submit(stress.client_run, client, r))
                    for job in jobs:
                        job.result()
            load = load_average()
        finally:
            for burner in burners:
                burner.terminate()
                burner.join(5)
            stop_process(process, log)
            keys = list(r.scan_iter(match=f"{namespace}*", count=1000))
            if keys:
                r.delete(*keys)
            r.close()
        elapsed = time.monotonic() - started
        counts = ", ".join(f"{k}={v}" for k, v in sorted(stress.counts.items()))
        if stress.reply_s:
            ordered = sorted(stress.reply_s)
            p50, p99 = (ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.5, 0.99))
            print(
                f"seconds from publishing to the reply (clean runs): median {p50:.3f}, "
                f"p99 {p99:.3f}, max {ordered[-1]:.3f}"
            )
        print(
            f"{args.runs} runs in {elapsed:.0f} s ({args.concurrency} at a time, {args.load} "
            f"busy loops, reply within {args.within:g} s): {counts}; load average {load}"
        )
        clean = sum(v for k, v in stress.counts.items() if k.endswith(":clean"))
        raise SystemExit(0 if clean == args.runs else 1)


if __name__ == "__main__":
    main()
