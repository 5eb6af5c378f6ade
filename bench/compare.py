"""toolfleet against Dramatiq + Results, Celery, arq and a raw LPUSH/BRPOP floor.

    python bench/compare.py                # 5 interleaved rounds (~10 min on 2 cores)
    python bench/compare.py --rounds 3
    python bench/compare.py --quick        # 2 short rounds, a smoke test
    python bench/compare.py --cluster      # also toolfleet on a 3-master loopback cluster

Needs the bench extra: ``pip install -e '.[bench]'``. Starts a private ``redis-server``
on a free port of 127.0.0.1 (never 6379), then for each round and each system in turn
(A B C D E, A B C D E, ...): FLUSHALL, start the system's workers (same number of
processes for all), measure its idle Redis traffic, run the producer phases in a
separate process (``driver.py``), record worker memory, stop the workers. Prints a
markdown table of medians over the rounds and writes it, the raw JSON and a PNG chart
to ``bench/results/``. Every process it starts is killed on exit, error or Ctrl-C.

With ``--cluster`` it also starts a Redis Cluster of ``--masters`` (3) masters on
loopback (``redis-server --cluster-enabled yes``, ``redis-cli --cluster create``) and,
in each round after the other systems, runs toolfleet on it (``system``
``toolfleet-cluster``: one queue group, whose slot is on another master than
``{fleet}``), recording per master its Redis CPU and commands per call (``per_master``
of each phase, with the slots it holds: ``roles`` ``group`` / ``fleet``).
``bench/report.py --sizing`` turns that into the sizing table of docs/cluster.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import orjson
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "apps"))

from _common import (  # noqa: E402
    BENCH_DIR,
    CommandCensus,
    PrivateCluster,
    PrivateRedis,
    Procs,
    bench_env,
    counters_delta,
    memory_mib,
    redis_counters,
)
from _process import load_average  # noqa: E402
from report import render_markdown  # noqa: E402
from systems import BY_KEY, NAMESPACE, SYSTEMS, System, cluster_system, variant  # noqa: E402

from toolfleet.shared.naming import fleet_namespace, group_namespace  # noqa: E402

RESULTS_DIR = BENCH_DIR / "results"
DRIVER_TIMEOUT_S = 900.0


def machine_info(redis_version: str) -> dict[str, Any]:
    cpu = platform.processor() or "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    versions = {}
    for dist in ("toolfleet", "dramatiq", "celery", "kombu", "arq", "redis", "hiredis"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "redis_server": redis_version,
        "kernel": platform.release(),
        "packages": versions,
        "git": git_revision(),
        "load_before": load_average(),
    }


def git_revision() -> str:
    """The repo's HEAD and whether the toolfleet sources differ from it (read-only)."""

    def git(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["git", *argv], cwd=BENCH_DIR.parent, capture_output=True, text=True, timeout=30
        )

    try:
        head = git("rev-parse", "--short", "HEAD").stdout.strip()
        dirty = git("diff", "--quiet", "HEAD", "--", "shared", "producer", "worker").returncode
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{head}{' + uncommitted changes' if dirty else ''}" if head else "unknown"


@dataclass
class Target:
    """The Redis a system runs against: one server, or a cluster's masters.

    Attributes:
        url: what the workers and the producer connect to.
        ready: the client workers' readiness is read with.
        node_urls: ``redis://`` of each server whose commands are counted.
        flush: empties every server.
        driver_args: how the driver finds the servers' processes.
    """

    url: str
    ready: Any
    node_urls: list[str]
    flush: Callable[[], object]
    driver_args: list[str]


def single_target(server: PrivateRedis) -> Target:
    client = server.client()
    return Target(
        server.url, client, [server.url], client.flushall, ["--redis-pid", str(server.pid)]
    )


def cluster_roles(cluster: PrivateCluster, group: str) -> dict[int, list[str]]:
    """Master port -> the slots of the run it holds: ``group`` (the group's), ``fleet``."""
    group_master = cluster.master_of(group_namespace(NAMESPACE, group, cluster=True))
    fleet_master = cluster.master_of(fleet_namespace(NAMESPACE, cluster=True))
    return {
        port: [
            role for role, at in (("group", group_master), ("fleet", fleet_master)) if at == port
        ]
        for port in cluster.ports
    }


def pick_group(cluster: PrivateCluster) -> str:
    """A queue group name whose slot is on another master than ``{fleet}``.

    Then each master's Redis CPU is either the group's or the fleet slot's, not both.
    """
    for name in ("bench", *(f"bench{i}" for i in range(1, 100))):
        roles = cluster_roles(cluster, name)
        if all(len(r) < 2 for r in roles.values()):
            return name
    raise RuntimeError("no group name of bench, bench1..bench99 hashes apart from {fleet}")


def cluster_target(cluster: PrivateCluster, group: str) -> Target:
    roles = cluster_roles(cluster, group)
    nodes = [{"port": p, "pid": cluster.pid(p), "roles": roles[p]} for p in cluster.ports]
    return Target(
        cluster.url,
        cluster.client(),
        [cluster.node_url(p) for p in cluster.ports],
        cluster.flushall,
        ["--nodes", orjson.dumps(nodes).decode()],
    )


def measure_idle(urls: list[str], seconds: float, processes: int) -> dict[str, Any]:
    """Redis commands/s per worker process with no producer: all (commandstats, commands run
    by Lua scripts included, as Dramatiq's ~7 ops/s is counted) and top-level only (MONITOR),
    summed over the servers of ``urls``.
    """
    clients = [redis.Redis.from_url(url, socket_timeout=10) for url in urls]
    before = [redis_counters(c) for c in clients]
    started = time.monotonic()
    censuses = [CommandCensus(url).start() for url in urls]
    time.sleep(seconds)
    monitored = [census.stop() for census in censuses]
    elapsed = time.monotonic() - started
    deltas = [counters_delta(b, redis_counters(c)) for b, c in zip(before, clients, strict=True)]
    total = sum(d["total"] for d in deltas)
    per_command = _summed(d["per_command"] for d in deltas)
    top = _summed(m["top_level"] for m in monitored)
    for c in clients:
        c.close()
    return {
        "seconds": elapsed,
        "ops_per_s_per_process": total / elapsed / processes,
        "top_level_per_s_per_process": sum(top.values()) / elapsed / processes,
        "per_command": per_command,
        "top_level": top,
        "in_scripts": _summed(m["in_scripts"] for m in monitored),
    }


def _summed(counts: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for one in counts:
        for k, v in one.items():
            out[k] = out.get(k, 0) + v
    return out


def run_one(
    system: System,
    args: argparse.Namespace,
    procs: Procs,
    target: Target,
    workdir: Path,
    round_no: int,
) -> dict[str, Any]:
    target.flush()
    env = bench_env(target.url, NAMESPACE)
    if system.pythonpath:
        env["PYTHONPATH"] = os.pathsep.join([system.pythonpath, env["PYTHONPATH"]])
    log_path = workdir / f"{system.key}-{round_no}-workers.log"
    running = system.start(procs, env, args.processes, log_path)
    try:
        started = time.monotonic()
        system.wait_ready(target.ready, running, args.processes)
        startup_s = time.monotonic() - started
        time.sleep(1.0)
        idle = measure_idle(target.node_urls, args.idle_s, args.processes)
        out = workdir / f"{system.key}-{round_no}.json"
        tree_pids = [p.pid for p in running.tree()]
        # the 10,000-in-flight phase reads one server's client list: single Redis only
        ten_thousand = args.ten_thousand if system.kind == "toolfleet" and not system.group else 0
        argv = [
            sys.executable, str(BENCH_DIR / "driver.py"),
            "--system", system.kind,
            "--redis-url", target.url,
            *target.driver_args,
            "--worker-pids", ",".join(map(str, tree_pids)),
            "--suspend-pids", ",".join(map(str, running.worker_pids)),
            "--sequential", str(args.sequential),
            "--in-flight", str(args.in_flight),
            "--turns", str(args.turns),
            "--warmup", str(args.warmup),
            "--ten-thousand", str(ten_thousand),
            "--out", str(out),
        ]  # fmt: skip
        driver_log = workdir / f"{system.key}-{round_no}-driver.log"
        with driver_log.open("wb") as log:
            driver = procs.start(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
            try:
                code = driver.wait(timeout=DRIVER_TIMEOUT_S)
            finally:
                if driver.poll() is None:
                    procs.stop(driver, grace_s=2)
        if code != 0 or not out.exists():
            tail = driver_log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{system.label}: driver failed ({code}):\n{tail}")
        report: dict[str, Any] = orjson.loads(out.read_bytes())
        rss, pss = memory_mib(running.tree())
        report.update(
            system=system.key,
            label=system.label,
            round=round_no,
            startup_s=startup_s,
            idle=idle,
            worker_rss_mib=rss,
            worker_pss_mib=pss,
            worker_process_count=len(running.tree()),
        )
        return report
    finally:
        running.stop()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--quick", action="store_true", help="2 short rounds (a smoke test)")
    parser.add_argument("--processes", type=int, default=2, help="worker processes per system")
    parser.add_argument(
        "--systems",
        default=",".join(s.key for s in SYSTEMS),
        help="comma-separated subset of: " + ", ".join(s.key for s in SYSTEMS),
    )
    parser.add_argument("--sequential", type=int, default=500, help="sequential calls per run")
    parser.add_argument("--in-flight", type=int, default=5000, help="calls in flight at once")
    parser.add_argument("--turns", type=int, default=200, help="turns of 8 parallel calls")
    parser.add_argument("--warmup", type=int, default=500, help="warm-up calls per run")
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle measurement seconds")
    parser.add_argument("--ten-thousand", type=int, default=10_000, help="toolfleet in flight")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="also run toolfleet from a copy of its sources at PATH/toolfleet (A/B tests)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also run toolfleet on a loopback Redis Cluster (per-master figures)",
    )
    parser.add_argument("--masters", type=int, default=3, help="masters of --cluster")
    parser.add_argument("--no-chart", action="store_true", help="skip the PNG chart")
    parser.add_argument("--out-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds = min(args.rounds, 2)
        args.sequential, args.in_flight, args.turns = 150, 1000, 50
        args.warmup, args.idle_s, args.ten_thousand = 100, 3.0, 2000
    args.systems = [BY_KEY[k.strip()] for k in args.systems.split(",") if k.strip()]
    args.systems += [variant(spec) for spec in args.variant]
    return args


def _raise_on_sigterm() -> None:
    def handler(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _raise_on_sigterm()
    procs = Procs()
    runs: list[dict[str, Any]] = []
    workdir = Path(tempfile.mkdtemp(prefix="toolfleet-bench-"))
    try:
        server = PrivateRedis(procs).start()
        targets = {system.key: single_target(server) for system in args.systems}
        systems = list(args.systems)
        cluster = None
        if args.cluster:
            cluster = PrivateCluster(procs, args.masters).start()
            group = pick_group(cluster)
            system = cluster_system(group, args.masters)
            systems.append(system)
            targets[system.key] = cluster_target(cluster, group)
        meta = machine_info(server.version())
        meta.update(
            processes=args.processes,
            rounds=args.rounds,
            sequential=args.sequential,
            in_flight=args.in_flight,
            turns=args.turns,
            ten_thousand=args.ten_thousand,
            idle_s=args.idle_s,
            quick=args.quick,
        )
        if cluster is not None:
            meta["cluster"] = {
                "masters": args.masters,
                "group": group,
                "redis_server": cluster.version(),
                "roles": {str(p): r for p, r in cluster_roles(cluster, group).items()},
            }
        print(
            f"# {meta['date']}: {args.rounds} rounds × {len(systems)} systems, "
            f"{args.processes} worker processes, Redis {meta['redis_server']} on 127.0.0.1:"
            f"{server.port}; logs in {workdir}",
            flush=True,
        )
        for round_no in range(1, args.rounds + 1):
            for system in systems:
                t0 = time.monotonic()
                report = run_one(system, args, procs, targets[system.key], workdir, round_no)
                runs.append(report)
                seq, thr = report["sequential"], report["throughput"]
                print(
                    f"round {round_no} {system.label:<24} p50 {seq['p50_ms']:6.2f} ms  "
                    f"p99 {seq['p99_ms']:6.2f} ms  {thr['calls_per_s']:7.0f} calls/s  "
                    f"idle {report['idle']['ops_per_s_per_process']:6.1f} ops/s/proc  "
                    f"({time.monotonic() - t0:.0f} s)",
                    flush=True,
                )
        server.stop()
        if cluster is not None:
            cluster.stop()
    except KeyboardInterrupt:
        print("interrupted; stopping every process started", file=sys.stderr)
        return 130
    finally:
        procs.stop_all()
    meta["load_after"] = load_average()
    data = {"meta": meta, "runs": runs}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    suffix = "-quick" if args.quick else ""
    raw_path = args.out_dir / f"compare-{stamp}{suffix}.json"
    raw_path.write_bytes(orjson.dumps(data, option=orjson.OPT_INDENT_2))
    markdown = render_markdown(data)
    print()
    print(markdown)
    md_path = args.out_dir / f"compare{suffix}.md"
    md_path.write_text(markdown)
    print(f"\nwrote {raw_path}, {md_path}")
    if not args.no_chart:
        from chart import write_chart

        png = write_chart(data, args.out_dir / f"compare{suffix}.png")
        print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
