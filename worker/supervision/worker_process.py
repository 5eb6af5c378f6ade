"""One worker process: load extensions, run its own loop on the Dramatiq queues, drain on SIGTERM.

Started by the supervisor as ``python -m toolfleet.worker.supervision.worker_process ...``;
not a public API.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import signal
import socket
import sys
import threading
import time
from types import FrameType
from typing import TYPE_CHECKING

import redis

from toolfleet.shared.aggregates import Accumulator
from toolfleet.shared.failures import FailureLog
from toolfleet.shared.group_copies import copy_to_group
from toolfleet.shared.lifeline import die_with_parent
from toolfleet.shared.naming import (
    affinity_queue_for,
    broker_heartbeats_key,
    brokers_key,
    slot_name,
)
from toolfleet.shared.settings import Settings
from toolfleet.worker.messaging.broker import make_broker
from toolfleet.worker.messaging.maintenance import record_broker_queues
from toolfleet.worker.messaging.slots import SlotJanitor
from toolfleet.worker.pipeline.calls import CallPipeline
from toolfleet.worker.pipeline.cancels import CancelListener
from toolfleet.worker.pipeline.handler import CallHandler
from toolfleet.worker.pipeline.ledger import Ledger
from toolfleet.worker.pipeline.loop import CallLoop
from toolfleet.worker.pipeline.observe import Observer
from toolfleet.worker.pipeline.replies import post_rejection
from toolfleet.worker.pipeline.routes import RouteRecorder
from toolfleet.worker.registry.loader import load_all
from toolfleet.worker.registry.redaction import Redactor
from toolfleet.worker.registry.registry import Registry
from toolfleet.worker.registry.scrubbed_streams import scrub_standard_streams
from toolfleet.worker.supervision import metrics
from toolfleet.worker.supervision.exposition import MULTIPROC_ENV
from toolfleet.worker.supervision.health import remove_heartbeat, write_heartbeat
from toolfleet.worker.supervision.heartbeat import CatalogPublisher
from toolfleet.worker.supervision.inflight_table import InFlightTable, table_path
from toolfleet.worker.supervision.logs import configure_logging
from toolfleet.worker.supervision.reachability import wait_until_reachable
from toolfleet.worker.supervision.redis_factory import redis_client
from toolfleet.worker.tenancy.gate import Gate, breaker_event_poster

if TYPE_CHECKING:
    from dramatiq.brokers.redis import RedisBroker

    from toolfleet.worker.isolation.process import ProcessRunner

__all__ = ["main", "parse_args"]

log = logging.getLogger("toolfleet.worker.process")

#: Exit status of a process that has nothing to serve or cannot load an extension named on
#: its command line (the supervisor does not restart it, and exits with it).
EXIT_NOTHING_TO_SERVE = 78  # EX_CONFIG of sysexits.h
#: Exit status of a process drained because too many tool threads are stuck (restarted).
EXIT_STUCK = 4


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse the child's command line (written by the supervisor).

    It holds what only a worker process needs; every setting (Redis URL, namespace,
    time-outs) comes from :class:`Settings`, through the inherited environment.
    """
    parser = argparse.ArgumentParser(prog="toolfleet-worker-process")
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--queue", action="append", default=[])
    parser.add_argument("--extension", action="append", default=[])
    parser.add_argument("--no-entry-points", action="store_true")
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run until SIGTERM/SIGINT or until the supervisor goes away; return the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent(args.parent_pid)  # before any extension code can hold the GIL
    worker_id = f"{socket.gethostname()}:{os.getpid()}"
    settings = Settings.from_env()
    redis_url = settings.redis_url or ""  # empty when settings.redis_client builds the client
    redactor = Redactor(settings.secret_values())
    configure_logging(args.log_level, settings.log_format, worker_id, redactor)
    scrub_standard_streams(redactor)  # what tools print; extension secrets join at load
    stop = threading.Event()
    _install_signal_handlers(stop)
    _watch_parent(stop)

    registry = Registry(
        settings.namespace,
        secrets_dir=settings.secrets_dir,
        redactor=redactor,
        # "not served on this host" is the same in every process: the first one says it
        unservable_log_level=logging.WARNING if args.index == 0 else logging.DEBUG,
    )
    loaded, errors = load_all(
        args.extension,
        folders=settings.extension_folders(),
        entry_points_too=not args.no_entry_points,
    )
    registry.errors.update(errors)
    registry.add_extensions(loaded)
    for source in registry.errors:
        metrics.EXTENSION_LOAD_ERRORS.labels(source).inc()
    named = [spec for spec in args.extension if spec in registry.errors]
    if named:  # an extension named on the command line must load: refuse to start
        for spec in named:
            log.error("--extension %s: %s", spec, registry.errors[spec])
        return EXIT_NOTHING_TO_SERVE
    queues = registry.queues & set(args.queue) if args.queue else registry.queues
    if not queues:
        log.error("nothing to serve: no extension provides the queues %s", args.queue or "(any)")
        return EXIT_NOTHING_TO_SERVE
    process_runner = _process_runner(args, registry) if registry.needs_processes else None
    # What is loaded now lives as long as the process: out of the collector's sight
    # (gc.freeze), so neither its full collections (pauses on the calls' path) nor its last
    # one at exit, within the shutdown grace, walk it.
    gc.freeze()

    factory = settings.redis_client  # each process calls it itself
    functions = len(registry.served)
    try:  # live while waiting (a fresh heartbeat), not ready
        reachable = wait_until_reachable(
            redis_url,
            stop,
            factory=factory,
            on_wait=lambda: write_heartbeat(settings.health_dir, False, functions),
        )
    except BaseException:
        remove_heartbeat(settings.health_dir)
        raise
    if not reachable:  # stopped while Redis was down
        remove_heartbeat(settings.health_dir)
        return 0
    broker = make_broker(redis_url, settings.namespace, factory=factory, group=settings.queue_group)
    namespace = broker.namespace  # the group's key prefix on a cluster
    registry.switches.namespace = namespace  # the claim reads the group's copy
    copy_to_group(broker.client, namespace)  # a cluster: the group's switches and quotas
    broker.heartbeat_timeout = int(settings.broker_heartbeat_timeout_s * 1000)

    def on_poison(queue: str, data: bytes, error: Exception) -> None:
        metrics.POISON_MESSAGES.labels(queue).inc()
        _answer_poison(broker.client, settings.reply_ttl_s, data, error)

    broker.on_poison = on_poison
    tables_dir = os.environ.get(MULTIPROC_ENV)  # the supervisor's watchdog reads it there
    table = InFlightTable(table_path(tables_dir, os.getpid())) if tables_dir else None
    ledger = Ledger(
        broker.client,
        namespace,
        worker_id,
        settings.reply_ttl_s,
        settings.worker_ttl_s,
        claim_replicas=settings.claim_replicas,
        claim_replicas_timeout_ms=settings.claim_replicas_timeout_ms,
        table=table,
    )
    slot = slot_name(socket.gethostname(), os.getppid(), args.index)
    affinity_routes = {q: affinity_queue_for(q, slot) for q in registry.affinity_queues & queues}
    pipeline = CallPipeline(
        registry,
        worker_id=worker_id,
        process_runner=process_runner,
        emit=ledger.post_event,
        affinity_routes=affinity_routes,
        max_result_bytes=settings.max_result_bytes,
        max_arguments_bytes=settings.max_arguments_bytes,
        gate=Gate(
            broker.client,
            namespace,
            on_change=breaker_event_poster(broker.client, namespace, worker_id),
            on_waited=ledger.postpone,
        ),
    )
    routes = {private: public for public, private in affinity_routes.items()}
    aggregates = Accumulator() if settings.aggregates_ttl_s > 0 else None
    failures = FailureLog() if settings.failures_retention_s > 0 else None
    tally = metrics.Tally()  # out once per group commit and each second, not per call
    ledger.completer.after_write = tally.flush
    observer = Observer(
        registry,
        worker_id,
        models=frozenset(settings.quality_models),
        aggregates=aggregates,
        failures=failures,
        tally=tally,
    )
    recorder = (
        RouteRecorder(broker.client, namespace, worker_id, settings.affinity_ttl_s)
        if routes
        else None
    )
    handler = CallHandler(pipeline, ledger, observer, recorder)
    # before anything is fetched: the broker's heartbeat, then the record of its queues by
    # which maintenance finds the acks sets it leaves if it dies
    started = broker.client.pipeline(transaction=False)
    started.hset(brokers_key(namespace), worker_id, broker.broker_id)
    started.zadd(broker_heartbeats_key(namespace), {broker.broker_id: int(time.time() * 1000)})
    record_broker_queues(started, namespace, broker.broker_id, queues | set(routes))
    started.execute()
    janitor = (
        # gone at the age at which producers stop routing there (its calls wait no longer)
        SlotJanitor(broker.client, namespace, affinity_routes, settings.worker_ttl_s)
        if routes
        else None
    )
    publisher = CatalogPublisher(
        broker.client,
        namespace,
        registry,
        worker_id,
        queues | set(routes),
        settings.heartbeat_interval_s,
        settings.worker_ttl_s,
        broker=broker,
        janitor=janitor,
        threads=args.threads,
        aggregates=aggregates,
        aggregates_ttl_s=settings.aggregates_ttl_s,
        failures=failures,
        failures_retention_s=settings.failures_retention_s,
        failures_max=settings.failures_max,
    )
    cancels = CancelListener(redis_url, namespace, pipeline, factory=factory)
    loop = CallLoop(
        broker,
        handler,
        {queue: queue for queue in queues} | routes,
        args.threads,
        connect=lambda: redis_client(redis_url, factory=factory, health_check_interval=30),
        reject=lambda raw, why: bool(
            raw is not None
            and post_rejection(broker.client, settings.reply_ttl_s, raw, why, worker_id)
        ),
    )
    loop.start()
    publisher.start()
    cancels.start()
    if janitor is not None:  # slots a supervisor killed outright left on this host: now
        _sweep_slots(janitor, broker)
    log.info(
        "serving %d functions on %s with %d threads",
        len(registry.served),
        sorted(queues),
        args.threads,
    )
    metrics.WORKER_UP.set(1)
    try:
        code = _serve_until_stopped(stop, pipeline, settings, tally)
        log.info("draining (grace %.1f s)", settings.shutdown_grace_s)
        publisher.stop()
        loop.stop(settings.shutdown_grace_s)
        tally.flush()
        cancels.stop()
        try:
            publisher.flush_aggregates()  # the calls answered since the last beat
        except redis.RedisError as exc:
            log.warning("could not write the last call aggregates: %s", exc)
        try:
            broker.client.hdel(brokers_key(namespace), worker_id)
        except redis.RedisError as exc:  # Redis gone at shutdown: its entry expires unread
            log.warning("could not unregister from Redis: %s", exc)
        registry.close()  # MCP sessions, then the event loop and the tool processes
        pipeline.close()
    finally:
        remove_heartbeat(settings.health_dir)
        if table is not None:
            table.close()
    return code


def _sweep_slots(janitor: SlotJanitor, broker: RedisBroker) -> None:
    """Hand back the calls of gone slots once (later sweeps come with the maintenance)."""
    try:
        janitor.sweep(broker)
    except redis.RedisError as exc:
        log.warning("could not sweep the slot queues at start: %s", exc)


#: Seconds the event loop may stay blocked by an ``async`` tool before the process is
#: drained and replaced (its other ``async`` calls cannot run meanwhile).
MAX_LOOP_BLOCK_S = 10.0


def _serve_until_stopped(
    stop: threading.Event, pipeline: CallPipeline, settings: Settings, tally: metrics.Tally
) -> int:
    """Watch the process's health each second; refresh the heartbeat file while healthy.

    Each second also writes the call metrics kept in memory since the last group commit.
    """
    blocked_since: float | None = None
    functions = len(pipeline.registry.served)
    write_heartbeat(settings.health_dir, True, functions)
    while not stop.wait(1.0):
        tally.flush()
        stuck = pipeline.runner.stuck_threads
        metrics.STUCK_THREADS.set(stuck)
        if stuck > settings.max_stuck_threads:
            log.error(
                "%d tool threads stuck (limit %d); draining", stuck, settings.max_stuck_threads
            )
            return EXIT_STUCK
        if pipeline.runner.loop_lag_s(timeout_s=0.5) >= 0.5:
            blocked_since = blocked_since or time.monotonic()
            if time.monotonic() - blocked_since > MAX_LOOP_BLOCK_S:
                log.error("an async tool blocks the event loop; draining for a fresh process")
                return EXIT_STUCK
            continue  # unhealthy: the heartbeat file goes stale
        blocked_since = None
        write_heartbeat(settings.health_dir, True, functions)
    return 0


def _process_runner(args: argparse.Namespace, registry: Registry) -> ProcessRunner:
    """The tool child processes; they read the settings from the inherited environment."""
    from toolfleet.worker.isolation.process import ProcessRunner

    modules = {s.partition(":")[0] for s in args.extension}
    for extension in registry.extensions.values():
        for tool in extension.tools:
            modules.add(getattr(tool, "__module__", None) or type(tool).__module__)
    runner = ProcessRunner(
        max_workers=args.threads,
        init_args=(list(args.extension), not args.no_entry_points, args.log_level),
        preload=sorted(m for m in modules if m and not m.startswith("toolfleet.shared")),
    )
    runner.warm_up()
    return runner


def _answer_poison(client: object, reply_ttl_s: int, data: bytes, error: Exception) -> None:
    """Answer ``rejected`` to an undecodable message when its request can still be read."""
    from toolfleet.shared import codec

    try:
        body = codec.loads(data)
    except codec.DecodeError:
        return
    found = body.get("args") if isinstance(body, dict) else None
    inner = found[0] if isinstance(found, list) and found else None
    if inner is not None:
        post_rejection(client, reply_ttl_s, inner, f"undecodable message: {error}", "")  # type: ignore[arg-type]


def _install_signal_handlers(stop: threading.Event) -> None:
    def handler(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def _watch_parent(stop: threading.Event) -> None:
    parent = os.getppid()

    def watch() -> None:
        while not stop.wait(1.0):
            if os.getppid() != parent:
                log.warning("supervisor %d is gone; shutting down", parent)
                stop.set()

    threading.Thread(target=watch, name="toolfleet-parent-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
