"""Where a toolfleet call's time goes between ``submit`` and its future resolving.

    python bench/profile_hot_path.py            # py-spy comes with the bench extra

Starts a private Redis and ``toolfleet worker -p 2`` with the bench's no-op tool, then:

1. **latency breakdown** of sequential calls (wall clock, medians): ``submit()`` itself,
   the wait until a worker's toolkit starts the call (``result.queued_s``), the tool's run
   (``result.run_s``), and the rest (result, reply post, listener wake-up, future);
2. **CPU profiles** with py-spy (sampling, all threads) of the worker processes and of
   this producer process, during sequential calls and during bursts of 5,000 in flight:
   folded stacks go to ``bench/results/profile-*.txt``; a summary by component is printed.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "apps"))

from _common import BENCH_DIR, PrivateRedis, Procs, bench_env, median, percentile  # noqa: E402
from systems import BY_KEY, NAMESPACE  # noqa: E402

RESULTS_DIR = BENCH_DIR / "results"

#: (library, regex on a frame "function (file:line)"); the leaf-most match wins.
LIBRARIES = [
    ("pydantic", r"\(pydantic/|pydantic_core"),
    ("orjson / json / toolfleet codec", r"\(json/|codec\.py|orjson"),
    ("redis-py", r"\(redis/|hiredis"),
    ("logging", r"\(logging/"),
    ("prometheus_client", r"\(prometheus_client/"),
    ("blinker", r"\(blinker/"),
    ("uuid", r"\(uuid\.py"),
    ("threading / futures / queue", r"\(threading\.py|\(concurrent/|\(queue\.py"),
    ("dramatiq", r"\(dramatiq/"),
    ("toolfleet", r"\((worker|producer|shared|extensions)/"),
]

#: (stage, regex on a frame); the deepest (leaf-most) matching frame names the stage.
STAGES = [
    ("consumer: wait (BLMOVE) + fetch script", r"WaitingConsumer\.__next__|do_fetch"),
    (
        "ack (Dramatiq ack script; unanswered deliveries)",
        r"WaitingConsumer\.(ack|_settle)|RedisBroker\._dispatch",
    ),
    ("decode request (pydantic)", r"ToolCallRequest\.decode"),
    ("claim script (outcome, cancel, switches, SET NX, HSET)", r"Ledger\.(claim|_claim)"),
    ("observer (metrics, signals, event dicts)", r"Observer\."),
    ("parse + validate arguments", r"parse_arguments"),
    ("run the tool (hand-off to a reused tool thread)", r"run_sync|InProcess\w*\.run"),
    ("toolkit (context, result, redaction)", r"Toolkit\."),
    ("finish script (ack, outcome SET, events XADD, RPUSH)", r"Ledger\.finish|post_outcome"),
    ("toolfleet handler (call_scope, size check)", r"CallHandler\.|call_scope|inline_ack"),
    ("Dramatiq worker thread + middleware", r"WorkerThread|Broker\.emit|ConsumerThread"),
    ("submit: build request", r"build_request|ToolClient\._request|new_call_id"),
    ("submit: catalog check", r"Catalog"),
    ("submit: publish (encode + EVALSHA)", r"Publisher\."),
    ("submit: register future", r"ReplyListener\.expect"),
    ("listener: BLPOP + LPOP", r"ReplyListener\._run"),
    ("listener: decode replies", r"ReplyListener\._deliver|ReplyEnvelope\.decode"),
    ("listener: resolve futures", r"_resolve"),
    ("listener: deadlines", r"_run_deadlines|_expire"),
    ("submit (other)", r"ToolClient\.submit"),
    ("caller waits on future", r"ToolClient\.call|Future\.result"),
]


def _toolfleet_fleet(procs: Procs, server: PrivateRedis, processes: int, workdir: Path) -> Any:
    system = BY_KEY["toolfleet"]
    env = bench_env(server.url, NAMESPACE)
    os.environ.update({k: env[k] for k in ("TOOLFLEET_REDIS_URL", "TOOLFLEET_NAMESPACE")})
    running = system.start(procs, env, processes, workdir / "workers.log")
    system.wait_ready(server.client(), running, processes)
    return running


def latency_breakdown(client: Any, function: str, count: int) -> dict[str, float]:
    """Medians (ms) of each leg of ``count`` sequential calls.

    ``queued_s`` counts from the request's ``sent_at`` (stamped inside ``submit()``, just
    before the catalog check and the publish) to the worker's toolkit starting the call.
    """
    legs: dict[str, list[float]] = collections.defaultdict(list)
    for i in range(count):
        resolved: list[float] = []
        t0 = time.perf_counter()
        future = client.submit(function, {"n": i})
        t1 = time.perf_counter()
        future.add_done_callback(lambda _f, out=resolved: out.append(time.perf_counter()))
        result = future.result()
        t3 = time.perf_counter()
        t2 = resolved[0] if resolved else t3
        submit = (t1 - t0) * 1000
        queued = (result.queued_s or 0.0) * 1000
        run = (result.run_s or 0.0) * 1000
        legs["total round trip"].append((t3 - t0) * 1000)
        legs["1 submit() returns (request, catalog, publish)"].append(submit)
        legs["2 → toolkit starts the call (wake, fetch, hand-off, decode)"].append(queued - submit)
        legs["3 run_s (the tool, on its thread)"].append(run)
        legs["4 → future resolved (result, reply post, listener)"].append(
            (t2 - t0) * 1000 - queued - run
        )
        legs["5 → caller wakes"].append((t3 - t2) * 1000)
    out = {k: median(v) for k, v in sorted(legs.items())}
    out["p99 total round trip"] = percentile(legs["total round trip"], 99)
    return out


def py_spy(pid: int, seconds: float, out: Path, subprocesses: bool) -> subprocess.Popen[bytes]:
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    argv = [binary, "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "250"]
    argv += ["--format", "raw", "--output", str(out), "--threads", "--nonblocking", "--gil"]
    if subprocesses:
        argv.append("--subprocesses")
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def summarize(folded: Path, top: int = 15) -> str:
    """Samples by stage (deepest toolfleet step), by library (leaf-most), and top self time."""
    by_stage: collections.Counter[str] = collections.Counter()
    by_library: collections.Counter[str] = collections.Counter()
    self_time: collections.Counter[str] = collections.Counter()
    total = 0
    stages = [(name, re.compile(rx)) for name, rx in STAGES]
    libraries = [(name, re.compile(rx)) for name, rx in LIBRARIES]
    for line in folded.read_text().splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = [f for f in stack.split(";") if "(" in f]
        if not frames:
            continue
        total += count
        self_time[_short(frames[-1])] += count
        by_stage[_first_match(reversed(frames), stages)] += count
        by_library[_first_match(reversed(frames), libraries)] += count
    if not total:
        return f"{folded.name}: no samples"
    lines = [f"{folded.name}: {total} samples (250 Hz, threads holding the GIL)", "  by stage:"]
    lines += [f"    {n / total:6.1%}  {name}" for name, n in by_stage.most_common()]
    lines.append("  by library (leaf-most frame):")
    lines += [f"    {n / total:6.1%}  {name}" for name, n in by_library.most_common()]
    lines.append("  top self time:")
    lines += [f"    {n / total:6.1%}  {name}" for name, n in self_time.most_common(top)]
    return "\n".join(lines)


def _first_match(frames: Any, patterns: list[tuple[str, re.Pattern[str]]]) -> str:
    for frame in frames:
        for name, rx in patterns:
            if rx.search(frame):
                return name
    return "other"


def _short(frame: str) -> str:
    frame = re.sub(r"\s+", " ", frame.strip())
    frame = re.sub(r"\(/[^)]*?/(site-packages|main|lib/python3\.\d+)/", "(", frame)
    return frame


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--sequential", type=int, default=1000)
    parser.add_argument("--bursts", type=int, default=4, help="bursts of --in-flight calls")
    parser.add_argument("--in-flight", type=int, default=5000)
    parser.add_argument(
        "--summarize", action="store_true", help="only summarize the saved profile-*.txt"
    )
    args = parser.parse_args()
    if args.summarize:
        for name in ("sequential", "throughput"):
            for side in ("workers", "producer"):
                path = RESULTS_DIR / f"profile-{name}-{side}.txt"
                if path.exists():
                    print(summarize(path), end="\n\n")
        return 0

    from bench_tools import FUNCTION

    from toolfleet.producer import ToolClient

    procs = Procs()
    workdir = Path(tempfile.mkdtemp(prefix="toolfleet-profile-"))
    RESULTS_DIR.mkdir(exist_ok=True)
    try:
        server = PrivateRedis(procs).start()
        running = _toolfleet_fleet(procs, server, args.processes, workdir)
        supervisor = running.roots[0].pid
        client = ToolClient(server.url, namespace=NAMESPACE)
        for i in range(300):
            client.call(FUNCTION, {"n": i})

        print("## latency breakdown of sequential calls (medians, ms)")
        for leg, ms in latency_breakdown(client, FUNCTION, args.sequential).items():
            print(f"  {ms:7.3f}  {leg}")

        reports = []
        for phase in ("sequential", "throughput"):
            seconds = 8 if phase == "sequential" else 0
            out_w = RESULTS_DIR / f"profile-{phase}-workers.txt"
            out_p = RESULTS_DIR / f"profile-{phase}-producer.txt"
            started = time.monotonic()
            if phase == "sequential":
                spies = [
                    py_spy(supervisor, seconds, out_w, True),
                    py_spy(os.getpid(), seconds, out_p, False),
                ]
                time.sleep(1.0)  # py-spy attaches
                while time.monotonic() - started < seconds + 0.5:
                    client.call(FUNCTION, {"n": 1})
            else:
                seconds = 2 + args.bursts * args.in_flight / 700
                spies = [
                    py_spy(supervisor, seconds, out_w, True),
                    py_spy(os.getpid(), seconds, out_p, False),
                ]
                time.sleep(1.0)
                done = 0
                t0 = time.perf_counter()
                for _ in range(args.bursts):
                    if time.monotonic() - started > seconds - 1:
                        break
                    futures = [client.submit(FUNCTION, {"n": i}) for i in range(args.in_flight)]
                    done += sum(1 for f in futures if f.result().status == "ok")
                rate = done / (time.perf_counter() - t0)
                print(f"\n## throughput while profiled: {done} calls, {rate:,.0f} calls/s")
            for spy in spies:
                try:
                    spy.wait(timeout=seconds + 60)
                except subprocess.TimeoutExpired:
                    spy.kill()
            reports += [summarize(out_w), summarize(out_p)]
        print()
        print("\n\n".join(reports))
        client.close(wait=False)
    finally:
        procs.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
