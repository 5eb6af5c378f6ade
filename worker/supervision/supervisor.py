"""Supervise N worker processes: restart one that dies, drain all on SIGTERM.

Dramatiq's own CLI stops the whole process group when one process dies; a tool fleet
must keep serving instead. Children run in their own session, so a terminal's Ctrl-C
or a container runtime's SIGTERM reaches each child exactly once, from here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import FrameType

import redis

from toolfleet.shared.connect import is_cluster
from toolfleet.shared.naming import group_namespace
from toolfleet.shared.settings import Settings
from toolfleet.worker.messaging.recovery import CrashRule, recover_dead_worker
from toolfleet.worker.supervision.exposition import (
    LIVE_PATH,
    READY_PATH,
    Probe,
    mark_dead,
    prepare_multiprocess_dir,
    serve_metrics,
)
from toolfleet.worker.supervision.health import (
    check_live,
    check_ready,
    remove_heartbeat,
    remove_supervisor_beat,
    write_supervisor_beat,
)
from toolfleet.worker.supervision.reachability import wait_until_reachable
from toolfleet.worker.supervision.redis_factory import redis_client
from toolfleet.worker.supervision.watchdog import start_watchdog

__all__ = ["Supervisor", "WorkerOptions"]

log = logging.getLogger("toolfleet.worker.supervisor")

#: A process exiting with this status soon after start cannot serve (bad configuration, an
#: extension named on its command line failed): the supervisor stops instead of
#: restarting it forever. Any other exit, or this one later in life, is restarted.
EXIT_NOTHING_TO_SERVE = 78
CONFIG_EXIT_WINDOW_S = 60.0
#: A process that died this many times in a row within 5 s of its start gets no stand-in
#: in its queues' live-worker sets while it is restarted (see :meth:`Supervisor._recover`):
#: a slot that cannot start stops counting as live after ``worker_ttl_s``.
STAND_IN_QUICK_DEATHS = 3
#: Seconds past ``shutdown_grace_s`` a worker process has to finish its drain (close its
#: pools, say goodbye to Redis) before it is killed.
KILL_MARGIN_S = 1.0


@dataclass
class WorkerOptions:
    """How to run each worker process.

    Every setting (Redis URL or client factory, namespace, time-outs, the ``/metrics``
    port) is in :attr:`settings`; the other attributes are what only a supervisor's
    command line says.

    Attributes:
        settings: the fleet's settings; the worker processes get them through their
            environment (:meth:`Settings.as_environment`).
        processes: number of worker processes.
        threads: Dramatiq worker threads per process.
        queues: queues to consume (empty: every queue of the loaded extensions).
        extensions: ``MODULE:ATTR`` specs loaded besides the entry points.
        entry_points: whether to load the ``toolfleet.extensions`` entry points.
        log_level: logging level name of the worker processes.
        metrics_dir: multiprocess metrics folder when ``PROMETHEUS_MULTIPROC_DIR`` is unset;
            with neither, a private temporary folder removed at exit.
        environment_extra: variables set in each worker process's environment over this
            process's (e.g. ``PYTHONPATH`` for extensions importable only from here); the
            settings still win.
    """

    settings: Settings
    processes: int = 1
    threads: int = 8
    queues: Sequence[str] = ()
    extensions: Sequence[str] = ()
    entry_points: bool = True
    log_level: str = "INFO"
    metrics_dir: str | None = None
    environment_extra: Mapping[str, str] = field(default_factory=dict)

    def argv(self, index: int) -> list[str]:
        """The command line of worker process number ``index``.

        It holds no setting (a Redis URL may carry a password, and every user of the
        machine can read ``/proc/<pid>/cmdline``): those travel in :meth:`environment`.
        """
        argv = [
            sys.executable,
            "-m",
            "toolfleet.worker.supervision.worker_process",
            "--parent-pid",
            str(os.getpid()),
            "--index",
            str(index),
            "--threads",
            str(self.threads),
            "--log-level",
            self.log_level,
        ]
        for queue in self.queues:
            argv += ["--queue", queue]
        for spec in self.extensions:
            argv += ["--extension", spec]
        if not self.entry_points:
            argv.append("--no-entry-points")
        return argv

    @property
    def redis_url(self) -> str:
        """The settings' Redis URL ("" when a client factory builds the client)."""
        return self.settings.redis_url or ""

    def environment(self) -> dict[str, str]:
        """The environment of a worker process: this one's, with :attr:`settings` in it."""
        names = Settings.variable_names()
        env = {k: v for k, v in os.environ.items() if k not in names}
        env.update(self.environment_extra)
        env.update(self.settings.as_environment())
        return env


@dataclass
class _Slot:
    index: int
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = field(default_factory=time.monotonic)


class Supervisor:
    """Start, watch and stop the worker processes.

    ``run()`` blocks until SIGTERM/SIGINT (or :meth:`stop`), then forwards SIGTERM
    once to each child, waits ``shutdown_grace_s`` plus :data:`KILL_MARGIN_S`, and
    kills (``SIGKILL``) stragglers with their process groups. Each worker process asks
    the kernel to kill it when the supervisor dies (:mod:`toolfleet.shared.lifeline`),
    so a supervisor killed outright leaves no worker process behind either.
    """

    #: seconds between restarts of the same slot when it keeps dying at start-up
    RESTART_BACKOFF_S = (0.0, 0.5, 1.0, 2.0, 5.0)

    def __init__(self, options: WorkerOptions) -> None:
        self.options = options
        self.slots = [_Slot(i) for i in range(options.processes)]
        self._stop = threading.Event()

    def pids(self) -> list[int]:
        """PIDs of the live worker processes."""
        return [s.process.pid for s in self.slots if s.process and s.process.poll() is None]

    def stop(self) -> None:
        """Ask :meth:`run` to drain and return."""
        self._stop.set()

    def run(self, install_signals: bool = True) -> int:
        """Supervise until stopped; return 0, or 78 when a process could not start serving."""
        if install_signals:
            self._install_signal_handlers()
        metrics = prepare_multiprocess_dir(self.options.metrics_dir)
        self.metrics_dir = metrics.path
        try:
            return self._supervise()
        finally:
            metrics.remove()

    def _supervise(self) -> int:
        self.registry = serve_metrics(
            self.options.settings.metrics_port, self.metrics_dir, probes=self._probes()
        )
        health_dir = Settings.from_env().health_dir
        try:  # live meanwhile (the beat), not ready: Redis's outage is not this process's
            reachable = wait_until_reachable(
                self.options.redis_url,
                self._stop,
                factory=self.options.settings.redis_client,
                on_wait=lambda: write_supervisor_beat(health_dir),
            )
        finally:
            remove_supervisor_beat(health_dir)
        if not reachable:
            return 0  # stopped while Redis was down: nothing started, nothing to drain
        for slot in self.slots:
            self._start(slot)
        client = redis_client(self.options.redis_url, factory=self.options.settings.redis_client)
        watchdog = start_watchdog(
            client,
            self._namespace(client),
            self.options.settings.reply_ttl_s,
            self.pids,
            self.registry,
            self.options.settings.heartbeat_interval_s,
            aggregates_ttl_s=self.options.settings.aggregates_ttl_s,
            failures_retention_s=self.options.settings.failures_retention_s,
            failures_max=self.options.settings.failures_max,
            tables_dir=self.metrics_dir,
        )
        nothing_to_serve = False
        while not self._stop.wait(0.2):
            for slot in self.slots:
                code = slot.process.poll() if slot.process else None
                if code is None:
                    continue
                young = time.monotonic() - slot.started_at < CONFIG_EXIT_WINDOW_S
                if code == EXIT_NOTHING_TO_SERVE and young:
                    nothing_to_serve = True
                    self._stop.set()
                    break
                pid = slot.process.pid if slot.process else -1
                log.warning("worker process %d (pid %d) exited with %s; restarting",
                            slot.index, pid, code)  # fmt: skip
                # a stand-in keeps its queues live meanwhile, unless it keeps dying at start
                standing_in = slot.restarts < STAND_IN_QUICK_DEATHS and not self._stop.is_set()
                self._recover(pid, restarting=standing_in)
                mark_dead(pid, self.metrics_dir)
                watchdog.tables.forget(pid)
                remove_heartbeat(Settings.from_env().health_dir, pid)
                self._restart(slot)
        watchdog.stop()
        self._drain()
        return EXIT_NOTHING_TO_SERVE if nothing_to_serve else 0

    def _probes(self) -> dict[str, Probe]:
        """``/livez`` and ``/readyz``: the checks of ``toolfleet health --live/--ready``."""
        settings = Settings.from_env()
        directory, stale_s = settings.health_dir, settings.health_stale_s
        url, factory = self.options.redis_url, self.options.settings.redis_client
        return {
            LIVE_PATH: lambda: check_live(directory, stale_s),
            READY_PATH: lambda: check_ready(directory, stale_s, url, factory=factory),
        }

    def _namespace(self, client: object) -> str:
        """The key prefix of this supervisor's queue group (the group's slot on a cluster)."""
        settings = self.options.settings
        return group_namespace(settings.namespace, settings.queue_group, cluster=is_cluster(client))

    def _recover(self, pid: int, *, restarting: bool = False) -> None:
        """Hand back dead process ``pid``'s messages (and its calls' crash rule).

        ``restarting``: the process is about to be replaced, so a stand-in keeps its
        queues live meanwhile (see :func:`recover_dead_worker`).
        """
        client = redis_client(self.options.redis_url, factory=self.options.settings.redis_client)
        host = socket.gethostname()
        stand_in = f"{host}:restarting-{os.getpid()}" if restarting else None
        try:
            rule = CrashRule.from_settings(self.options.settings)
            namespace = self._namespace(client)
            recover_dead_worker(client, namespace, f"{host}:{pid}", rule, stand_in=stand_in)
        except redis.RedisError as exc:
            log.error("could not requeue the messages of pid %d: %s", pid, exc)
        finally:
            client.close()

    def _start(self, slot: _Slot) -> None:
        slot.process = subprocess.Popen(
            self.options.argv(slot.index), env=self.options.environment(), start_new_session=True
        )
        slot.started_at = time.monotonic()

    def _restart(self, slot: _Slot) -> None:
        quick_death = time.monotonic() - slot.started_at < 5.0
        slot.restarts = slot.restarts + 1 if quick_death else 0
        delay = self.RESTART_BACKOFF_S[min(slot.restarts, len(self.RESTART_BACKOFF_S) - 1)]
        if delay and self._stop.wait(delay):
            return
        self._start(slot)

    def _drain(self) -> None:
        live = [s.process for s in self.slots if s.process and s.process.poll() is None]
        try:
            self._drain_processes(live)
        finally:
            for process in live:  # anything a process left unacknowledged goes back
                self._recover(process.pid)

    def _drain_processes(self, live: list[subprocess.Popen[bytes]]) -> None:
        for process in live:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.options.settings.shutdown_grace_s + KILL_MARGIN_S
        for process in live:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                # A tool holding the GIL keeps the process from running its own drain;
                # SIGKILL needs no cooperation. Its process group (its session, started
                # here) goes too; its other children die with it (parent-death signal).
                log.error("worker pid %d did not stop in time; killing it", process.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.kill()
                process.wait()

    def _install_signal_handlers(self) -> None:
        def handler(signum: int, frame: FrameType | None) -> None:
            self._stop.set()

        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
