"""CPU instructions the producer side spends per call, counted by callgrind (no timing).

For toolfleet and for Dramatiq + Results in turn, on one private ``redis-server``: the
system's real workers (as ``compare.py`` starts them, the no-op tool), and the producer
in a process of its own under ``valgrind --tool=callgrind --instr-atstart=no``, so
nothing is counted until asked. The producer warms up (sequential calls, then a burst),
then, with its instrumentation on (``callgrind_control -i on``): ``--idle`` seconds with
no call, and a burst of ``--calls`` calls in flight (toolfleet: ``ToolClient.submit`` x N,
then every ``.result()``; Dramatiq: ``actor.send`` x N, then every
``message.get_result(block=True)``). Each window's instructions (``Ir``) come from a dump
(``callgrind_control -d``); the idle rate times the burst's wall time is subtracted from
the burst's (``net``), and the rest divided by the calls. Then one more burst, not
counted, under ``MONITOR``: the Redis commands the producer's own connections sent per
call (top level, and those its scripts ran).

Counts do not depend on the machine's load; the idle subtraction only roughly, and how
many calls share a batch (toolfleet's write-behind) depends on how fast Redis answers.

    .venv/bin/python bench/producer_instructions.py [--calls 400] [--idle 5]
        [--systems toolfleet,dramatiq] [--annotate DIR]

``--annotate DIR`` keeps each system's burst dump in ``DIR`` (``callgrind_annotate``
reads it: where the instructions go, function by function).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import IO, Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH / "apps")]

#: Seconds any call of the child may take (the producer runs slowly under callgrind).
CALL_TIMEOUT_S = 600.0


# -- the producer process (runs under callgrind) -----------------------------------------


def _child(system: str, calls: int, warmup: int) -> None:
    """Warm up, say ``ready``, then run a burst per ``burst`` line read from stdin."""
    url = os.environ["BENCH_REDIS_URL"]
    if system == "toolfleet":
        from bench_tools import FUNCTION

        from toolfleet.producer import ToolClient

        client = ToolClient(url)

        def burst(ns: range) -> Counter[str]:
            submit = client.submit
            futures = [submit(FUNCTION, {"n": n}, timeout_s=CALL_TIMEOUT_S) for n in ns]
            return Counter(
                "ok" if r.ok and r.content == n else r.status.value
                for r, n in zip((f.result() for f in futures), ns, strict=True)
            )

    else:
        import dramatiq_app

        actor, backend = dramatiq_app.noop, dramatiq_app.backend
        timeout_ms = int(CALL_TIMEOUT_S * 1000)

        def burst(ns: range) -> Counter[str]:
            send = actor.send
            messages = [send(n) for n in ns]
            values = [
                m.get_result(backend=backend, block=True, timeout=timeout_ms) for m in messages
            ]
            return Counter("ok" if v == n else "wrong" for v, n in zip(values, ns, strict=True))

    for n in range(20):
        burst(range(n, n + 1))
    burst(range(warmup))
    _say("ready " + json.dumps([t.name for t in threading.enumerate()]))
    while True:  # a short poll keeps the process scheduled (callgrind_control needs it)
        readable, _, _ = select.select([sys.stdin], [], [], 0.2)
        if not readable:
            continue
        line = sys.stdin.readline().strip()
        if line == "burst":
            statuses = burst(range(calls))
            _say("done " + json.dumps(dict(statuses)))
        elif line in ("quit", ""):
            return


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


# -- the orchestrator --------------------------------------------------------------------


def _control(*argv: str) -> None:
    subprocess.run(["callgrind_control", *argv], check=True, capture_output=True, timeout=300)


def _dumped_ir(files: set[Path]) -> int:
    return sum(_per_thread(files).values())


def _per_thread(files: set[Path]) -> dict[int, int]:
    """Instructions per callgrind thread number (1: the main thread; one file without
    ``--separate-threads``)."""
    found: dict[int, int] = {}
    for path in sorted(files):
        text = path.read_text()
        total = re.search(r"^(?:summary|totals):\s*(\d+)", text, re.MULTILINE)
        thread = re.search(r"^thread:\s*(\d+)", text, re.MULTILINE)
        number = int(thread.group(1)) if thread else 1
        found[number] = found.get(number, 0) + (int(total.group(1)) if total else 0)
    return found


def _dump(folder: Path, pid: int) -> tuple[int, set[Path]]:
    """Dump ``pid``'s counters now: the instructions since its last dump, and the files."""
    before = set(folder.glob(f"cg.{pid}*"))
    _control("-d", str(pid))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        new = set(folder.glob(f"cg.{pid}*")) - before
        if new:
            time.sleep(1.0)  # let the file be written whole
            new = set(folder.glob(f"cg.{pid}*")) - before
            return _dumped_ir(new), new
        time.sleep(0.2)
    raise RuntimeError(f"no dump of {pid}")


def _read_line(stream: IO[bytes], timeout_s: float) -> str:
    box: list[bytes] = []
    reader = threading.Thread(target=lambda: box.append(stream.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    if not box or not box[0]:
        raise RuntimeError("the producer process did not answer")
    return box[0].decode().strip()


class Census:
    """``MONITOR``: per client port, top-level commands and those its scripts ran."""

    def __init__(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url)
        self.top: Counter[tuple[int, str]] = Counter()
        self.scripts: Counter[tuple[int, str]] = Counter()
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._url = url
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Census:
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        import redis

        last_port = 0
        try:
            with self._client.monitor() as monitor:  # type: ignore[no-untyped-call]
                self._ready.set()
                while not self._stop.is_set():
                    command = monitor.next_command()
                    name = str(command["command"]).split(" ", 1)[0].lower()
                    if command.get("client_type") == "lua":  # after the EVALSHA that ran it
                        self.scripts[(last_port, name)] += 1
                        continue
                    last_port = int(command.get("client_port") or 0)
                    self.top[(last_port, name)] += 1
        except redis.RedisError:
            pass
        finally:
            self._ready.set()

    def stop(self) -> None:
        from _common import end_monitor

        end_monitor(self._url, self._stop, self._thread)
        self._client.close()

    def of(self, ports: set[int], calls: int) -> dict[str, Any]:
        top = Counter({n: c for (p, n), c in self.top.items() if p in ports})
        scripts = Counter({n: c for (p, n), c in self.scripts.items() if p in ports})
        return {
            "top_level_per_call": round(sum(top.values()) / calls, 3),
            "in_scripts_per_call": round(sum(scripts.values()) / calls, 3),
            "top_level": {k: round(v / calls, 3) for k, v in sorted(top.items())},
            "in_scripts": {k: round(v / calls, 3) for k, v in sorted(scripts.items())},
        }


def _redis_ports(pid: int, redis_port: int) -> set[int]:
    """The local ports of ``pid``'s TCP connections to the Redis on ``redis_port``."""
    import psutil

    return {
        c.laddr.port
        for c in psutil.Process(pid).net_connections(kind="tcp")
        if c.raddr and c.raddr.port == redis_port
    }


def measure(system_key: str, args: argparse.Namespace, server: Any, procs: Any) -> dict[str, Any]:
    """One system: its workers, its producer under callgrind, the counted windows."""
    from _common import bench_env
    from systems import BY_KEY, NAMESPACE

    system = BY_KEY[system_key]
    admin = server.client()
    admin.flushall()
    folder = Path(tempfile.mkdtemp(prefix=f"producer-ir-{system_key}-"))
    env = bench_env(server.url, NAMESPACE)
    running = system.start(procs, env, args.processes, folder / "workers.log")
    child = None
    try:
        system.wait_ready(admin, running, args.processes, timeout_s=120)
        child = procs.start(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--separate-threads={'yes' if args.per_thread else 'no'}",
                f"--callgrind-out-file={folder}/cg.%p",
                sys.executable,
                str(Path(__file__).resolve()),
                "--child",
                system_key,
                "--calls",
                str(args.calls),
                "--warmup",
                str(args.warmup),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(folder / "producer.log").open("wb"),
        )
        assert child.stdin is not None and child.stdout is not None
        ready = _read_line(child.stdout, 900)
        if not ready.startswith("ready "):
            raise RuntimeError(f"{system_key}: the producer did not get ready")
        threads = json.loads(ready.removeprefix("ready "))

        def send(line: str) -> None:
            assert child is not None and child.stdin is not None
            child.stdin.write(line.encode() + b"\n")
            child.stdin.flush()

        pid = child.pid
        _control("-i", "on", str(pid))
        _dump(folder, pid)  # from zero
        started = time.monotonic()
        time.sleep(args.idle)
        idle_ir, _ = _dump(folder, pid)
        idle_rate = idle_ir / (time.monotonic() - started)
        started = time.monotonic()
        send("burst")
        done = _read_line(child.stdout, 1800)
        burst_ir, files = _dump(folder, pid)
        burst_s = time.monotonic() - started
        statuses = json.loads(done.removeprefix("done "))
        if args.annotate:
            Path(args.annotate).mkdir(parents=True, exist_ok=True)
            for i, path in enumerate(sorted(files)):
                shutil.copy(path, Path(args.annotate) / f"{system_key}-{i}.callgrind")
        ports = _redis_ports(pid, server.port)
        census = Census(server.url).start()
        send("burst")
        census_done = _read_line(child.stdout, 1800)
        census.stop()
        ports |= _redis_ports(pid, server.port)
        send("quit")
        child.wait(timeout=120)
        net = burst_ir - idle_rate * burst_s
        per_thread = {
            f"{n}:{threads[n - 1] if n <= len(threads) else '?'}": round(ir / args.calls)
            for n, ir in sorted(_per_thread(files).items())
        }
        return {
            "system": system.label,
            "calls": args.calls,
            "statuses": statuses,
            "census_statuses": json.loads(census_done.removeprefix("done ")),
            "burst_wall_s": round(burst_s, 1),
            "idle_ir_per_s": round(idle_rate),
            "burst_ir": burst_ir,
            "ir_per_call": round(burst_ir / args.calls),
            "net_ir_per_call": round(net / args.calls),
            **({"ir_per_call_by_thread": per_thread} if args.per_thread else {}),
            "redis_commands": census.of(ports, args.calls),
        }
    finally:
        if child is not None and child.poll() is None:
            procs.stop(child, grace_s=5)
        running.stop()
        admin.close()
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="calls in flight per burst")
    parser.add_argument("--warmup", type=int, default=200, help="calls of the warm-up burst")
    parser.add_argument("--idle", type=float, default=5.0, help="seconds of the idle window")
    parser.add_argument("--processes", type=int, default=1, help="worker processes")
    parser.add_argument("--systems", default="toolfleet,dramatiq")
    parser.add_argument("--annotate", default="", help="keep the burst dumps in this folder")
    parser.add_argument("--keep", action="store_true", help="keep the work folders")
    parser.add_argument(
        "--per-thread",
        action="store_true",
        help="also instructions per call by thread (callgrind --separate-threads; the names "
        "are the producer's threads in start order, roughly callgrind's numbers)",
    )
    parser.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.calls, args.warmup)
        return
    from _common import PrivateRedis, Procs

    procs = Procs()
    server = PrivateRedis(procs).start()
    results: dict[str, Any] = {}
    try:
        for key in args.systems.split(","):
            results[key] = measure(key, args, server, procs)
            print(json.dumps(results[key], indent=2), flush=True)
    finally:
        server.stop()
        procs.stop_all()
    if "toolfleet" in results and "dramatiq" in results:
        tf, dq = results["toolfleet"], results["dramatiq"]
        print(json.dumps({
            "toolfleet_ir_per_call": tf["ir_per_call"],
            "dramatiq_ir_per_call": dq["ir_per_call"],
            "ratio": round(tf["ir_per_call"] / dq["ir_per_call"], 3),
            "toolfleet_net_ir_per_call": tf["net_ir_per_call"],
            "dramatiq_net_ir_per_call": dq["net_ir_per_call"],
            "net_ratio": round(tf["net_ir_per_call"] / dq["net_ir_per_call"], 3),
            "toolfleet_redis_top_level_per_call": tf["redis_commands"]["top_level_per_call"],
            "dramatiq_redis_top_level_per_call": dq["redis_commands"]["top_level_per_call"],
        }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
