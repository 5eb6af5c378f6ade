"""``toolfleet exporter``: the fleet-wide gauges, read from Redis, served from one place.

Queue depth, dead letters and live workers per queue describe the whole fleet, not a pod.
When every supervisor exported them, a dashboard's ``sum by (queue)`` multiplied them by
the number of pods and each alert on them fired once per pod. They are served here
instead, by one exporter per Redis namespace (a Deployment of one replica, the way
redis_exporter and celery-exporter run), and the supervisors' ``/metrics`` carry only
per-process series, which sum correctly.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from wsgiref.simple_server import WSGIServer

import redis
from prometheus_client import CollectorRegistry, make_wsgi_app

from toolfleet.shared.errors import ConfigurationError
from toolfleet.worker.supervision.collector_guard import GuardedRegistry
from toolfleet.worker.supervision.exposition import (
    LIVE_PATH,
    READY_PATH,
    QueueCollector,
    listen,
    probe_app,
)
from toolfleet.worker.supervision.health import HealthReport
from toolfleet.worker.supervision.redis_factory import redis_client

__all__ = ["DEFAULT_PORT", "fleet_registry", "run_exporter", "serve_exporter"]

log = logging.getLogger("toolfleet.worker.exporter")

#: The exporter's port unless told otherwise (the supervisors use 9191).
DEFAULT_PORT = 9192


def fleet_registry(
    redis_url: str, namespace: str, worker_ttl_s: float, *, factory: str | None = None
) -> CollectorRegistry:
    """A registry holding only :class:`QueueCollector` (the fleet-wide gauges), guarded.

    When the collector raises (odd catalog data), ``/metrics`` still answers 200 with
    ``toolfleet_collector_errors_total`` counting it (:class:`GuardedRegistry`).

    Args:
        redis_url: the fleet's Redis (ignored when ``factory`` is given).
        namespace: the fleet's key namespace.
        worker_ttl_s: seconds a worker's heartbeat counts as live.
        factory: ``MODULE:ATTR`` of a ``redis.Redis`` factory, or None.
    """
    registry = GuardedRegistry()
    registry.register(QueueCollector(redis_url, namespace, worker_ttl_s, factory=factory))
    return registry


def _ready(redis_url: str, factory: str | None) -> HealthReport:
    try:
        options = {"socket_timeout": 2, "socket_connect_timeout": 2}
        redis_client(redis_url, factory=factory, **options).ping()
    except ConfigurationError as exc:
        return HealthReport(False, str(exc))
    except redis.RedisError as exc:
        return HealthReport(False, f"Redis unreachable: {exc}")
    return HealthReport(True, "Redis reachable")


def serve_exporter(
    port: int,
    redis_url: str,
    namespace: str,
    worker_ttl_s: float,
    *,
    factory: str | None = None,
) -> WSGIServer:
    """Serve ``/metrics`` (fleet-wide gauges), ``/livez`` and ``/readyz`` from a thread.

    ``/livez`` answers 200 while the process serves; ``/readyz`` when Redis answers a ping.

    Raises:
        OSError: the port cannot be bound.
    """
    registry = fleet_registry(redis_url, namespace, worker_ttl_s, factory=factory)
    probes = {
        LIVE_PATH: lambda: HealthReport(True, "exporter serving"),
        READY_PATH: lambda: _ready(redis_url, factory),
    }
    server = listen(port, probe_app(make_wsgi_app(registry), probes))
    threading.Thread(target=server.serve_forever, daemon=True, name="exporter").start()
    return server


def run_exporter(
    port: int,
    redis_url: str,
    namespace: str,
    worker_ttl_s: float,
    *,
    factory: str | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT; return the exit status (0).

    Raises:
        OSError: the port cannot be bound.
    """
    stop = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    server = serve_exporter(port, redis_url, namespace, worker_ttl_s, factory=factory)
    log.info("exporting fleet-wide metrics of namespace %r on port %d", namespace, port)
    stop.wait()
    server.shutdown()
    server.server_close()
    return 0
