"""Shared helpers of the benchmark: a private Redis, process bookkeeping, Redis counters.

Every process the benchmark starts goes through :class:`Procs`, which kills it (its
whole process group, plus any descendants that left the group) on exit, on an
exception and on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import psutil
import redis
import redis.cluster
from _stats import median as median  # re-exported: the bench scripts import them from here
from _stats import percentile as percentile

BENCH_DIR = Path(__file__).resolve().parent
APPS_DIR = BENCH_DIR / "apps"
REPO_DIR = BENCH_DIR.parent


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (never the shared 6379)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port != 6379:
            return int(port)
    raise RuntimeError("no free port")


def redis_server_binary() -> str:
    """The system ``redis-server`` when there is one, else the embedded one (the demo extra)."""
    found = shutil.which("redis-server")
    if found:
        return found
    from toolfleet.worker.devtools.embedded_redis import redis_server_binary as embedded_binary

    return str(embedded_binary())


class Procs:
    """Start subprocesses in their own session and make sure they all die."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []
        self._known: dict[int, psutil.Process] = {}

    def start(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(list(argv), start_new_session=True, **kwargs)
        self._procs.append(proc)
        self.remember([proc.pid])
        return proc

    def remember(self, pids: Iterable[int]) -> None:
        """Record processes (e.g. grandchildren in their own session) to kill at the end."""
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                self._known.setdefault(pid, psutil.Process(pid))

    def tree(self, proc: subprocess.Popen[bytes]) -> list[psutil.Process]:
        """``proc`` and its live descendants (recorded for cleanup)."""
        try:
            root = psutil.Process(proc.pid)
            members = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        self.remember(p.pid for p in members)
        return members

    def stop(self, proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
        """SIGTERM the group of ``proc``, wait up to ``grace_s``, then SIGKILL what is left."""
        members = self.tree(proc)
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)
        _kill_all(members, 3.0)
        if proc in self._procs:
            self._procs.remove(proc)

    def stop_all(self) -> None:
        for proc in list(self._procs):
            with contextlib.suppress(Exception):
                self.stop(proc, grace_s=5.0)
        _kill_all(list(self._known.values()), 1.0)
        self._known.clear()


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _kill_all(members: list[psutil.Process], grace_s: float) -> None:
    alive = []
    for p in members:
        with contextlib.suppress(psutil.Error):
            if p.is_running():
                p.terminate()
                alive.append(p)
    _, still = psutil.wait_procs(alive, timeout=grace_s)
    for p in still:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(still, timeout=grace_s)


class PrivateRedis:
    """A ``redis-server`` on a private port of 127.0.0.1, no persistence."""

    def __init__(self, procs: Procs) -> None:
        self.procs = procs
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="toolfleet-bench-redis-")
        self.binary = redis_server_binary()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> PrivateRedis:
        argv = [
            self.binary,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--dir", self.dir,
            "--maxclients", "10000",
            "--loglevel", "warning",
        ]  # fmt: skip
        self.proc = self.procs.start(argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                if self.client().ping():
                    return self
            time.sleep(0.05)
        raise RuntimeError("the private redis-server did not start")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=10)

    def version(self) -> str:
        return str(self.client().info("server")["redis_version"])

    def stop(self) -> None:
        if self.proc is not None:
            self.procs.stop(self.proc, grace_s=5)
            self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)


class PrivateCluster:
    """A Redis Cluster of ``masters`` ``redis-server`` processes on 127.0.0.1, no replicas.

    Each node runs ``--cluster-enabled yes`` on a free port (its bus port given, also
    free), joined by ``redis-cli --cluster create``; no persistence.
    """

    def __init__(self, procs: Procs, masters: int = 3) -> None:
        self.procs = procs
        self.ports = [free_port() for _ in range(masters)]
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)
        self.dir = tempfile.mkdtemp(prefix="toolfleet-bench-cluster-")
        self.binary = redis_server_binary()
        self.nodes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, timeout_s: float = 30.0) -> PrivateCluster:
        cli = shutil.which("redis-cli") or shutil.which("valkey-cli")
        if not cli:
            raise RuntimeError("--cluster needs redis-cli (or valkey-cli) on PATH")
        for port in self.ports:
            folder = Path(self.dir) / str(port)
            folder.mkdir()
            argv = [
                self.binary,
                "--port", str(port), "--cluster-port", str(free_port()),
                "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                "--cluster-config-file", str(folder / "nodes.conf"),
                "--save", "", "--appendonly", "no", "--dir", str(folder),
                "--maxclients", "10000", "--loglevel", "warning",
            ]  # fmt: skip
            self.nodes[port] = self.procs.start(argv, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        for port in self.ports:
            while not _answers(port):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node 127.0.0.1:{port} did not start")
                time.sleep(0.05)
        create = [cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                  "--cluster-replicas", "0", "--cluster-yes"]  # fmt: skip
        done = subprocess.run(create, capture_output=True, timeout=60, check=False)
        if done.returncode != 0:
            raise RuntimeError(
                f"redis-cli --cluster create failed: {done.stdout!r} {done.stderr!r}"
            )
        while time.monotonic() < deadline:
            states = [self.node(p).cluster("info").get("cluster_state") for p in self.ports]
            if all(state == "ok" for state in states):
                return self
            time.sleep(0.1)
        raise RuntimeError(f"the cluster did not reach cluster_state:ok: {states}")

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node (its own commands and counters only)."""
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)

    def node_url(self, port: int) -> str:
        return f"redis://127.0.0.1:{port}/0"

    def pid(self, port: int) -> int:
        return self.nodes[port].pid

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot (hash tags applied)."""
        from redis.crc import key_slot

        slot = key_slot(key.encode())
        for start, end, master, *_ in self.node(self.ports[0]).cluster("slots"):
            if start <= slot <= end:
                return int(master[1])
        raise RuntimeError(f"no master serves slot {slot}")

    def client(self) -> redis.cluster.RedisCluster:
        """A cluster client (routing by slot)."""
        nodes = [redis.cluster.ClusterNode("127.0.0.1", p) for p in self.ports]  # type: ignore[no-untyped-call]
        return redis.cluster.RedisCluster(startup_nodes=nodes, socket_timeout=10)

    def flushall(self) -> None:
        for port in self.ports:
            self.node(port).flushall()

    def version(self) -> str:
        return str(self.node(self.ports[0]).info("server")["redis_version"])

    def stop(self) -> None:
        for proc in self.nodes.values():
            self.procs.stop(proc, grace_s=5)
        self.nodes.clear()
        shutil.rmtree(self.dir, ignore_errors=True)


def _answers(port: int) -> bool:
    with contextlib.suppress(redis.RedisError):
        return bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=1).ping())
    return False


# -- counters ------------------------------------------------------------------


def redis_counters(client: redis.Redis) -> dict[str, Any]:
    """Top-level commands processed and per-command calls (commands run by scripts included)."""
    stats = client.info("stats")
    commands = client.info("commandstats")
    per_command = {
        name.removeprefix("cmdstat_"): int(v["calls"])
        for name, v in commands.items()
        if isinstance(v, dict)
    }
    return {"total": int(stats["total_commands_processed"]), "per_command": per_command}


def counters_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """What happened between two :func:`redis_counters` snapshots (minus their own INFOs)."""
    per = {
        k: v - before["per_command"].get(k, 0)
        for k, v in after["per_command"].items()
        if v - before["per_command"].get(k, 0)
    }
    per["info"] = per.get("info", 0) - 2  # the two INFO calls of the "before" snapshot
    if per["info"] <= 0:
        per.pop("info")
    return {"total": after["total"] - before["total"] - 2, "per_command": per}


class CommandCensus:
    """Count the commands Redis runs (MONITOR), top-level vs. inside Lua scripts.

    MONITOR slows Redis down: use it only where that does not matter (idle, a census).
    ``start()``, then ``stop()`` returns ``{"top_level": {...}, "in_scripts": {...}}``.
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.top: dict[str, int] = {}
        self.lua: dict[str, int] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> CommandCensus:
        self._thread.start()
        self._ready.wait(5)
        return self

    def _run(self) -> None:
        client = redis.Redis.from_url(self.url)
        try:
            with client.monitor() as monitor:  # type: ignore[no-untyped-call]
                self._ready.set()
                while not self._stop.is_set():
                    command = monitor.next_command()
                    name = str(command["command"]).split(" ", 1)[0].lower()
                    side = self.lua if command.get("client_type") == "lua" else self.top
                    side[name] = side.get(name, 0) + 1
        except redis.RedisError:
            pass
        finally:
            self._ready.set()
            client.close()

    def stop(self) -> dict[str, dict[str, int]]:
        self._stop.set()
        waker = redis.Redis.from_url(self.url)
        try:
            for _ in range(50):  # each command wakes the monitor loop to see the stop flag
                waker.ping()
                self._thread.join(0.1)
                if not self._thread.is_alive():
                    break
        finally:
            waker.close()
        top = {k: v for k, v in self.top.items() if k not in ("ping", "monitor", "info")}
        return {"top_level": top, "in_scripts": dict(self.lua)}


def cpu_seconds(procs: Iterable[psutil.Process]) -> float:
    """User + system CPU seconds of live processes (dead ones count 0)."""
    total = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            t = p.cpu_times()
            total += t.user + t.system
    return total


def memory_mib(procs: Iterable[psutil.Process]) -> tuple[float, float]:
    """Total RSS and PSS (MiB) of live processes."""
    rss = pss = 0.0
    for p in procs:
        with contextlib.suppress(psutil.Error):
            info = p.memory_full_info()
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
    return rss / 2**20, pss / 2**20


def bench_env(redis_url: str, namespace: str) -> dict[str, str]:
    """Environment of every bench subprocess: apps importable, the private Redis URL."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(APPS_DIR), str(BENCH_DIR), *filter(None, [env.get("PYTHONPATH")])]
    )
    env["BENCH_REDIS_URL"] = redis_url
    env["TOOLFLEET_REDIS_URL"] = redis_url
    env["TOOLFLEET_NAMESPACE"] = namespace
    env["PYTHONUNBUFFERED"] = "1"
    return env


def end_monitor(url: str, stop: threading.Event, thread: threading.Thread) -> None:
    """End a thread reading ``MONITOR`` on ``url``: set ``stop``, then send ``PING`` s
    (each is a line the monitor reads, so its loop sees ``stop``) until it has ended, 5 s
    at most."""
    stop.set()
    waker = redis.Redis.from_url(url)
    try:
        for _ in range(50):
            waker.ping()
            thread.join(0.1)
            if not thread.is_alive():
                break
    finally:
        waker.close()
