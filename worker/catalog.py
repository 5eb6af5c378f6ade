"""Publish this process's catalog entries and per-queue heartbeats; refresh switch states.

Producers read them to list tools, route calls and fail fast (``not_available``)
when no live worker serves a function's queue.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from toolfleet.shared import codec
from toolfleet.shared.naming import catalog_key, extension_errors_key, workers_key
from toolfleet.worker.toolkit import Toolkit

__all__ = ["CatalogPublisher"]

log = logging.getLogger("toolfleet.worker.catalog")


class CatalogPublisher:
    """A daemon thread that refreshes catalog and heartbeats every ``interval_s`` seconds.

    Args:
        client: Redis client.
        namespace: key prefix.
        toolkit: what this process serves.
        queues: the queues this process consumes.
        interval_s: seconds between heartbeats.
        worker_ttl_s: heartbeats older than this are pruned from the workers sets.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        toolkit: Toolkit,
        queues: set[str],
        interval_s: float,
        worker_ttl_s: float,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.toolkit = toolkit
        self.queues = sorted(queues)
        self.interval_s = interval_s
        self.worker_ttl_s = worker_ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolfleet-catalog", daemon=True)

    def publish(self) -> None:
        """Write catalog entries and heartbeats once (one pipelined round trip)."""
        now = time.time()
        pipe = self.client.pipeline(transaction=False)
        entries = {
            name: codec.dumps(served.catalog_entry())
            for name, served in self.toolkit.served.items()
            if served.queue in self.queues
        }
        if entries:
            pipe.hset(catalog_key(self.namespace), mapping=entries)  # type: ignore[arg-type]
        if self.toolkit.errors:
            errors = {k: self.toolkit.redactor.scrub(v) for k, v in self.toolkit.errors.items()}
            pipe.hset(extension_errors_key(self.namespace), mapping=errors)  # type: ignore[arg-type]
        for queue in self.queues:
            key = workers_key(self.namespace, queue)
            pipe.zadd(key, {self.toolkit.worker_id: now})
            pipe.zremrangebyscore(key, "-inf", now - self.worker_ttl_s * 3)
        pipe.execute()
        self.toolkit.switches.refresh(self.client)

    def withdraw(self) -> None:
        """Remove this worker from every queue's live set (on shutdown)."""
        pipe = self.client.pipeline(transaction=False)
        for queue in self.queues:
            pipe.zrem(workers_key(self.namespace, queue), self.toolkit.worker_id)
        pipe.execute()

    def start(self) -> None:
        """Publish now, then keep publishing on a daemon thread."""
        self.publish()
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and withdraw the heartbeats."""
        self._stop.set()
        try:
            self.withdraw()
        except redis.RedisError as exc:
            log.warning("could not withdraw heartbeats: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.publish()
            except redis.RedisError as exc:
                log.warning("catalog heartbeat failed: %s", exc)
