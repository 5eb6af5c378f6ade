"""The supervisor's ``/metrics`` (every worker process's samples) and the fleet-wide gauges.

The supervisor serves per-process series only; :class:`QueueCollector`'s fleet-wide gauges
are served once per fleet by ``toolfleet exporter`` (:mod:`toolfleet.worker.supervision.exporter`).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

import redis
from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from toolfleet.producer.catalog import read_entries
from toolfleet.shared import codec
from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.naming import (
    catalog_workers_key,
    dead_letters_key,
    queue_msgs_key,
    workers_key,
)
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.tenancy.lanes import LANES, lane_keys, uses_lanes
from toolfleet.worker.supervision.collector_guard import GuardedRegistry
from toolfleet.worker.supervision.health import HealthReport
from toolfleet.worker.supervision.redis_factory import redis_client

__all__ = [
    "LIVE_PATH",
    "READY_PATH",
    "MultiprocessDir",
    "QueueCollector",
    "listen",
    "mark_dead",
    "prepare_multiprocess_dir",
    "probe_app",
    "serve_metrics",
    "sweep_private_dirs",
]

log = logging.getLogger("toolfleet.worker.metrics")


#: prometheus-client reads its multiprocess folder from this variable (children inherit it).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


#: the prefix of the private folders under the temporary directory
PRIVATE_PREFIX = "toolfleet-metrics-"
#: the file in a private folder its supervisor holds an exclusive ``flock`` on
OWNER_LOCK = ".owner.lock"


@dataclass(frozen=True)
class MultiprocessDir:
    """The folder where one supervisor's worker processes write their metric samples.

    Attributes:
        path: the folder.
        private: True when the supervisor created it (and removes it at exit); False when
            the operator chose it (``PROMETHEUS_MULTIPROC_DIR`` or ``metrics_dir``).
        owner: the open lock file of a private folder (closed by :meth:`remove`).
    """

    path: Path
    private: bool
    owner: IO[str] | None = None

    def remove(self) -> None:
        """Delete a private folder and stop exporting it; an operator's folder stays."""
        if not self.private:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        if self.owner is not None:
            self.owner.close()
        if os.environ.get(MULTIPROC_ENV) == str(self.path):
            del os.environ[MULTIPROC_ENV]


def prepare_multiprocess_dir(directory: str | None) -> MultiprocessDir:
    """Choose this supervisor's metrics folder, empty it, and export it to child processes.

    ``PROMETHEUS_MULTIPROC_DIR`` when set, else ``directory``, is the operator's folder:
    emptied (stale files of dead processes would be summed in), kept at exit. With neither,
    a fresh private folder under the temporary directory, so two fleets on one host never
    read each other's samples; :meth:`MultiprocessDir.remove` deletes it. The supervisor
    holds a ``flock`` on a file in its private folder while it lives; the private folders
    of supervisors that died without removing theirs (``SIGKILL``, out of memory) hold
    no lock, and the next supervisor started on the host removes them
    (:func:`sweep_private_dirs`).

    Args:
        directory: the folder to use when ``PROMETHEUS_MULTIPROC_DIR`` is unset, or None.

    Returns:
        The folder, exported in ``os.environ`` for the worker processes started later.
    """
    chosen = os.environ.get(MULTIPROC_ENV) or directory
    owner = None
    if chosen:
        path = Path(chosen)
        if path.exists():
            shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True, exist_ok=True)
    else:
        sweep_private_dirs(Path(tempfile.gettempdir()))
        path = Path(tempfile.mkdtemp(prefix=PRIVATE_PREFIX))
        owner = _hold(path)
    os.environ[MULTIPROC_ENV] = str(path)
    return MultiprocessDir(path, private=not chosen, owner=owner)


def sweep_private_dirs(parent: Path) -> list[Path]:
    """Remove the private metrics folders under ``parent`` that no live supervisor holds.

    A folder counts as held while some process holds the ``flock`` on its
    :data:`OWNER_LOCK` (a lock the kernel drops when its holder dies, in any PID
    namespace). A folder without that file (one being made, or made by an older
    version) is left alone, as is one this user may not read.

    Returns:
        The folders removed.
    """
    removed = []
    for folder in parent.glob(PRIVATE_PREFIX + "*"):
        try:
            fd = os.open(folder / OWNER_LOCK, os.O_RDWR)  # never created here
        except OSError:  # no lock file, or not ours: not known to be stale
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # BlockingIOError: its supervisor lives
            continue
        else:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        finally:
            os.close(fd)
    return removed


def _hold(folder: Path) -> IO[str]:
    """Lock a new private folder; the open lock file, held until it is closed.

    The file is locked under a temporary name, then renamed: it appears already locked,
    so no sweep can take it in between.
    """
    staging = folder / f"{OWNER_LOCK}.{os.getpid()}"
    owner = staging.open("w")
    fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    staging.rename(folder / OWNER_LOCK)
    return owner


def mark_dead(pid: int, directory: Path) -> None:
    """Drop a dead process's live gauges (its counters stay in the totals)."""
    mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


class QueueCollector:
    """Collects queue depth, dead letters and live workers per queue from Redis.

    Metrics ``toolfleet_queue_depth``, ``toolfleet_dead_letters``,
    ``toolfleet_queue_workers``, ``toolfleet_queue_lane_depth`` and
    ``toolfleet_function_workers`` (per catalogued function), read at scrape time.

    Depth counts Dramatiq's ``<ns>:<queue>.msgs`` hash: pending, prefetched and running
    messages (what KEDA scales on). Lane depth counts the calls waiting in each of a
    queue's account lanes (:mod:`toolfleet.shared.tenancy.lanes`; at most ``LANES``
    series per queue). Queues are those of the catalog's names a live worker serves
    (:func:`~toolfleet.producer.catalog.read_entries`): the queue of a removed extension
    leaves with its names, one worker TTL after its last worker.
    """

    def __init__(
        self,
        redis_url: str,
        namespace: str,
        worker_ttl_s: float = 10.0,
        *,
        factory: str | None = None,
    ) -> None:
        self.client = redis_client(
            redis_url, factory=factory, socket_timeout=2, socket_connect_timeout=2
        )
        self.namespace = namespace
        self.worker_ttl_s = worker_ttl_s

    def collect(self) -> Iterator[Metric]:
        """One sample per queue, read at scrape time."""
        depth = GaugeMetricFamily(
            "toolfleet_queue_depth",
            "Messages in a queue (pending, prefetched and running).",
            labels=["queue"],
        )
        workers = GaugeMetricFamily(
            "toolfleet_queue_workers",
            "Worker processes with a fresh heartbeat on a queue.",
            labels=["queue"],
        )
        dead = GaugeMetricFamily(
            "toolfleet_dead_letters", "Dead-lettered messages of a queue.", labels=["queue"]
        )
        serving = GaugeMetricFamily(
            "toolfleet_function_workers",
            "Worker processes with a fresh heartbeat serving a catalogued function.",
            labels=["function"],
        )
        lanes = GaugeMetricFamily(
            "toolfleet_queue_lane_depth",
            "Calls waiting in one account lane of a queue (accounts hash into 16 lanes).",
            labels=["queue", "lane"],
        )
        try:
            layout = KeyLayout.of(self.client, self.namespace)  # a cluster: keys by slot
            entries = read_entries(self.client, layout.fleet, self.worker_ttl_s)
            layout.learn(entries)
            queues = sorted({str(e.get("queue")) for e in entries.values()})
            pipe = pipeline(self.client)
            since = time.time() - self.worker_ttl_s
            for queue in queues:
                pipe.hlen(queue_msgs_key(layout.of_queue(queue), queue))
                pipe.zcard(dead_letters_key(layout.of_queue(queue), queue))
                pipe.zcount(workers_key(layout.fleet, queue), since, "+inf")
            for queue in queues:
                for key in lane_keys(layout.of_queue(queue), queue):
                    pipe.llen(key)
            names = sorted(entries)
            for name in names:
                pipe.zcount(catalog_workers_key(layout.fleet, name), since, "+inf")
            values = pipe.execute()
        except (redis.RedisError, codec.DecodeError) as exc:
            log.warning("queue depth unavailable: %s", exc)
            queues, names, values = [], [], []
        for i, queue in enumerate(queues):
            depth.add_metric([queue], values[3 * i])
            dead.add_metric([queue], values[3 * i + 1])
            workers.add_metric([queue], values[3 * i + 2])
        for i, queue in enumerate(queues):
            start = 3 * len(queues) + LANES * i
            for lane, waiting in enumerate(values[start : start + LANES]):
                if uses_lanes(queue):
                    lanes.add_metric([queue, str(lane)], waiting)
        start = (3 + LANES) * len(queues)
        for name, count in zip(names, values[start:], strict=True):
            serving.add_metric([name], count)
        yield depth
        yield dead
        yield workers
        yield lanes
        yield serving


#: Paths of the probes, meaning ``toolfleet health --live`` and ``--ready``.
LIVE_PATH = "/livez"
READY_PATH = "/readyz"

#: A probe: no argument, the outcome of ``toolfleet health --live`` or ``--ready``.
Probe = Callable[[], HealthReport]


def probe_app(metrics: WSGIApplication, probes: dict[str, Probe]) -> WSGIApplication:
    """A WSGI app answering ``probes`` paths (200 healthy, 503 not; the reason as text).

    Args:
        metrics: the app serving every other path (prometheus-client's ``/metrics``).
        probes: path (``/livez``, ``/readyz``) to the check it runs at each request.
    """

    def app(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        probe = probes.get(str(environ.get("PATH_INFO", "")))
        if probe is None:
            return metrics(environ, start_response)
        report = probe()
        body = (report.reason + "\n").encode()
        status = "200 OK" if report.ok else "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [body]

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        """Probes and scrapes are not logged."""


#: The one line a supervisor logs when its ``/metrics`` port is taken.
_PORT_TAKEN = (
    "port %d is taken (by another toolfleet worker on this host?): this worker serves calls, "
    "but not /metrics, /livez or /readyz; give each worker on a host its own "
    "TOOLFLEET_METRICS_PORT (0 turns them off)"
)


def listen(port: int, app: WSGIApplication) -> WSGIServer:
    """A threading WSGI server for ``app`` on ``port``, all interfaces, not yet serving.

    Raises:
        OSError: the port cannot be bound.
    """
    return make_server("0.0.0.0", port, app, ThreadingWSGIServer, _QuietHandler)


def serve_metrics(
    port: int, directory: Path, *, probes: dict[str, Probe] | None = None
) -> CollectorRegistry | None:
    """Serve ``/metrics`` (and ``probes``) on ``port``, all interfaces, from a daemon thread.

    ``/metrics`` is the sum of the worker processes' samples in ``directory``: per-process
    series only (the fleet-wide gauges come from ``toolfleet exporter``). The registry is a
    :class:`~toolfleet.worker.supervision.collector_guard.GuardedRegistry`: a file that
    cannot be read, or a sample whose labels cannot be exposed (one written by an older
    version with a wire string as its label), is counted and left out, never a 500.
    Returns the registry (served unless ``port`` is 0), or None when the port cannot be
    bound: taken (one warning line; another worker on this host holds it, most often) or
    refused (an error line). The worker serves calls either way.
    ``probes`` maps paths such as ``/livez`` to checks (:func:`probe_app`).
    """
    registry = GuardedRegistry()
    MultiProcessCollector(registry, path=str(directory))  # type: ignore[no-untyped-call]
    if port:
        app = probe_app(make_wsgi_app(registry), probes or {})
        try:
            server = listen(port, app)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                log.error("cannot serve /metrics on port %d: %s", port, exc)
            else:  # a second worker on a laptop, most often: it serves, unobserved
                log.warning(_PORT_TAKEN, port)
            return None
        threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return registry
