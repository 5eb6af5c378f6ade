"""How to start each system's worker side, and how to tell it is ready."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import psutil
import redis
import redis.cluster
from _common import APPS_DIR, Procs
from report import CLUSTER_SYSTEM

from toolfleet.shared.naming import default_queue_for, fleet_namespace, workers_key

NAMESPACE = "tfbench"
TOOLFLEET_QUEUE = default_queue_for("bench")
READY_KEY = "bench:ready"


def _script(name: str) -> str:
    """A console script of this Python environment (``bench/.venv/bin/celery``, ...)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if not found:
        raise RuntimeError(
            f"{name!r} not found: install the bench extra (pip install -e '.[bench]')"
        )
    return found


@dataclass
class Running:
    """A started worker side: its root processes and where their output goes."""

    roots: list[subprocess.Popen[bytes]]
    log: IO[bytes]
    procs: Procs
    worker_pids: list[int] = field(default_factory=list)

    def tree(self) -> list[psutil.Process]:
        return [p for root in self.roots for p in self.procs.tree(root)]

    def stop(self) -> None:
        for root in self.roots:
            self.procs.stop(root, grace_s=15)
        self.log.close()


@dataclass(frozen=True)
class System:
    """One system under test.

    Attributes:
        key: short name used on the command line and in the JSON.
        label: name in the table.
        kind: which system it is (``toolfleet`` for a variant ``toolfleet@NAME``).
        pythonpath: put first on ``PYTHONPATH`` of the workers and the producer (a
            variant's copy of the toolfleet sources, laid out as ``PATH/toolfleet/...``).
        group: toolfleet on a Redis Cluster: the queue group its workers serve
            (``--queue-group``); empty on a single Redis.
    """

    key: str
    label: str
    kind: str = ""
    pythonpath: str = ""
    group: str = ""

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", self.key)

    def commands(self, processes: int) -> list[list[str]]:
        """Command lines of the worker side (one per root process)."""
        py = sys.executable
        if self.kind == "toolfleet":
            group = ["--queue-group", self.group] if self.group else []
            return [[
                _script("toolfleet"), "worker", "-p", str(processes), *group,
                "-Q", TOOLFLEET_QUEUE, "--extension", "bench_tools:extension",
            ]]  # fmt: skip
        if self.kind == "dramatiq":
            return [[_script("dramatiq"), "dramatiq_app", "-p", str(processes), "-t", "8"]]
        if self.kind == "celery":
            return [[
                _script("celery"), "-A", "celery_app", "worker",
                "-c", str(processes), "-P", "prefork", "-l", "WARNING",
            ]]  # fmt: skip
        if self.kind == "arq":
            return [[_script("arq"), "arq_app.WorkerSettings"] for _ in range(processes)]
        if self.kind == "raw":
            return [[py, str(APPS_DIR / "raw_worker.py")] for _ in range(processes)]
        raise ValueError(self.kind)

    def start(self, procs: Procs, env: dict[str, str], processes: int, log_path: Path) -> Running:
        log = log_path.open("wb")
        if self.pythonpath:
            env = {**env, "PYTHONPATH": os.pathsep.join([self.pythonpath, env["PYTHONPATH"]])}
        roots = [
            procs.start(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=APPS_DIR)
            for argv in self.commands(processes)
        ]
        return Running(roots=roots, log=log, procs=procs)

    def wait_ready(
        self,
        client: redis.Redis | redis.cluster.RedisCluster,
        running: Running,
        processes: int,
        timeout_s: float = 60.0,
    ) -> None:
        """Block until ``processes`` worker processes announced themselves (or raise)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(root.poll() is not None for root in running.roots):
                raise RuntimeError(f"{self.label}: a worker root process exited during start-up")
            if self._ready_count(client) >= processes:
                running.worker_pids = self._worker_pids(running)
                return
            time.sleep(0.1)
        running.log.flush()
        tail = Path(running.log.name).read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{self.label}: workers not ready within {timeout_s:.0f} s:\n{tail}")

    def _ready_count(self, client: redis.Redis | redis.cluster.RedisCluster) -> int:
        if self.kind == "toolfleet":
            since = time.time() - 10
            fleet = fleet_namespace(NAMESPACE, cluster=bool(self.group))
            return int(client.zcount(workers_key(fleet, TOOLFLEET_QUEUE), since, "+inf"))
        return int(client.scard(READY_KEY))

    def _worker_pids(self, running: Running) -> list[int]:
        """The processes that run calls (toolfleet: the supervisor's children)."""
        if self.kind == "toolfleet":
            return [p.pid for p in running.tree() if p.pid != running.roots[0].pid]
        return [p.pid for p in running.tree()]


SYSTEMS = [
    System("toolfleet", "toolfleet"),
    System("dramatiq", "Dramatiq + Results"),
    System("celery", "Celery (redis)"),
    System("arq", "arq"),
    System("raw", "raw LPUSH/BRPOP floor"),
]
BY_KEY = {s.key: s for s in SYSTEMS}


def cluster_system(group: str, masters: int) -> System:
    """toolfleet on a ``masters``-master cluster, its workers serving queue group ``group``."""
    return System(CLUSTER_SYSTEM, f"toolfleet, {masters}-master cluster", "toolfleet", group=group)


def variant(spec: str) -> System:
    """``NAME=PATH`` → a toolfleet system running the sources under ``PATH/toolfleet``."""
    name, _, path = spec.partition("=")
    if not name or not (Path(path) / "toolfleet").is_dir():
        raise ValueError(f"--variant {spec!r}: want NAME=PATH with PATH/toolfleet/worker etc.")
    return System(f"toolfleet@{name}", f"toolfleet@{name}", "toolfleet", str(Path(path).resolve()))
