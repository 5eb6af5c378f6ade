"""Publish this process's catalog entries and per-queue heartbeats; refresh switch states.

Producers read them to list tools, route calls and fail fast (``not_available``)
when no live worker serves a function's queue.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import redis
from dramatiq.brokers.redis import RedisBroker

from toolfleet.shared import aggregates as agg
from toolfleet.shared import codec
from toolfleet.shared import failures as fl
from toolfleet.shared.catalog_epoch import REPUBLISH_SCRIPT
from toolfleet.shared.catalog_life import PUBLISH_SCRIPT, contested_message, live_schemas
from toolfleet.shared.extension_errors import WorkerErrors
from toolfleet.shared.group_copies import restore_group_copy
from toolfleet.shared.naming import (
    broker_heartbeats_key,
    brokers_key,
    catalog_epoch_key,
    catalog_key,
    catalog_live_key,
    catalog_owners_key,
    catalog_recovering_key,
    catalog_schemas_key,
    catalog_workers_key,
    events_key,
    extension_errors_key,
    group_of_namespace,
    inflight_key,
    mcp_servers_key,
    worker_info_key,
    workers_key,
)
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.text import as_text
from toolfleet.shared.worker_info import WorkerInfo, parse_worker_infos, stale_ids
from toolfleet.worker.messaging.maintenance import record_broker_queues, run_maintenance
from toolfleet.worker.messaging.slots import SlotJanitor
from toolfleet.worker.pipeline.ledger import INFLIGHT_TTL_S
from toolfleet.worker.registry.registry import Registry
from toolfleet.worker.registry.served_tool import ServedTool

__all__ = ["CatalogPublisher"]

log = logging.getLogger("toolfleet.worker.catalog")


class CatalogPublisher:
    """A daemon thread that refreshes catalog and heartbeats every ``interval_s`` seconds.

    Args:
        client: Redis client.
        namespace: key prefix.
        registry: what this process serves.
        worker_id: ``host:pid`` of this process.
        queues: the queues this process consumes.
        interval_s: seconds between heartbeats.
        worker_ttl_s: heartbeats older than this are pruned from the workers sets.
        broker: this process's Dramatiq broker. Its heartbeat is refreshed every beat
            (Dramatiq refreshes it only when a consumer talks to Redis, which a worker
            whose threads are all busy with long calls may not do), with the record of
            the queues it consumes, and every 5th beat toolfleet's maintenance runs
            (:func:`~toolfleet.worker.messaging.maintenance.run_maintenance`), handing
            messages of brokers dead for ``heartbeat_timeout`` back to their queue and
            dropping dead letters older than ``dead_message_ttl``.
        janitor: registers this process's slot queues every beat and, with the
            maintenance, hands back the calls of slots that are gone (session affinity).
        threads: this process's worker threads (said in its :class:`WorkerInfo`).
        aggregates: the calls counted since the last beat; each beat adds them to the
            per-minute aggregates in the same pipeline (:func:`toolfleet.shared.aggregates.write`),
            and puts them back when the beat fails. ``None``: aggregates are off.
        aggregates_ttl_s: seconds each minute's aggregates live after a write.
        failures: the failed calls kept since the last beat; each beat adds them to the
            failures index in the same pipeline (:func:`toolfleet.shared.failures.write`)
            and puts them back when the beat fails. ``None``: the index is off.
        failures_retention_s: seconds a failure stays in the index.
        failures_max: most failures the index keeps.
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        registry: Registry,
        worker_id: str,
        queues: set[str],
        interval_s: float,
        worker_ttl_s: float,
        broker: RedisBroker | None = None,
        janitor: SlotJanitor | None = None,
        threads: int = 0,
        aggregates: agg.Accumulator | None = None,
        aggregates_ttl_s: int = 86_400,
        failures: fl.FailureLog | None = None,
        failures_retention_s: int = 86_400,
        failures_max: int = 200_000,
    ) -> None:
        self.client = client
        self.failures = failures
        self.failures_retention_s = failures_retention_s
        self.failures_max = failures_max
        self.threads = threads
        self._rtt_ms: float | None = None
        self._supervisor = f"{socket.gethostname()}:{os.getppid()}"
        self.aggregates = aggregates
        self.aggregates_ttl_s = aggregates_ttl_s
        self.janitor = janitor
        self.namespace = namespace
        self.registry = registry
        self.worker_id = worker_id
        self.queues = sorted(queues)
        self.interval_s = interval_s
        self.worker_ttl_s = worker_ttl_s
        self.broker = broker
        self._beats = 0
        self._epoch = ""  # the catalog epoch of the last beat
        self._remembered: list[str] = []  # the catalog's function names at the last beat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolfleet-catalog", daemon=True)

    def publish(self) -> None:
        """Write catalog entries and heartbeats once (two pipelined round trips).

        The catalog's epoch comes first (:mod:`toolfleet.shared.catalog_epoch`): into a
        Redis that lost its data, this worker opens the recovery window or gives it the
        function names it remembers, before its own entries are written. The entries go
        through :data:`~toolfleet.shared.catalog_life.PUBLISH_SCRIPT`, which refreshes
        each name's liveness and workers, refuses names another tool owns, and deletes
        the names no live worker serves; this worker's collisions are then reported with
        its extension errors. Its broker heartbeat (Dramatiq's; no fetch writes it), the
        TTL of its in-flight hash (no claim sets it), its worker info
        (:class:`~toolfleet.shared.worker_info.WorkerInfo`) and the call aggregates counted
        since the last beat (:mod:`toolfleet.shared.aggregates`; kept for the next beat
        when Redis fails) are written here too.
        """
        now = time.time()
        pipe = pipeline(self.client)
        pipe.eval(
            REPUBLISH_SCRIPT,
            2,
            catalog_epoch_key(self.namespace),
            catalog_recovering_key(self.namespace),
            uuid.uuid4().hex,
            max(1, int(self.worker_ttl_s * 1000)),
            self._epoch,
            "\n".join(self._remembered),
        )
        self.registry.refresh_tool_states()
        served = {n: s for n, s in self.registry.served.items() if s.queue in self.queues}
        keys, args = self._catalog_arguments(served, now)
        pipe.eval(PUBLISH_SCRIPT, len(keys), *keys, *args)
        gone = sorted(self.registry.take_withdrawn() - set(served))
        if gone:  # an MCP server dropped them; workers still serving them re-add them
            pipe.hdel(catalog_key(self.namespace), *gone)
        pipe.hkeys(catalog_key(self.namespace))
        replies = pipe.execute()
        self._epoch = as_text(replies[0])
        self._remembered = sorted(as_text(name) for name in replies[-1])
        pairs = [as_text(v) for v in replies[1][0]]
        self.registry.listed = frozenset(as_text(v) for v in replies[1][2])
        self.registry.live_schemas = live_schemas(replies[1][3])
        self._note_contested(dict(zip(pairs[::2], pairs[1::2], strict=True)), served)
        self._beat(now)
        self.registry.switches.refresh(self.client)
        self._beats += 1
        if self._beats % 5 == 0:
            self._prune_infos(now)
            if restore_group_copy(self.client, self.namespace):
                log.warning(
                    "the switches and quotas of queue group %s were gone from its master "
                    "(its data was lost): copied the fleet's again",
                    self.namespace,
                )
        if self.broker is not None and self._beats % 5 == 0:
            run_maintenance(self.broker, self.queues)
            if self.janitor is not None:
                self.janitor.sweep(self.broker)

    def _catalog_arguments(
        self, served: dict[str, ServedTool], now: float
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of :data:`~toolfleet.shared.catalog_life.PUBLISH_SCRIPT`."""
        ns = self.namespace
        keys = [catalog_key(ns), catalog_live_key(ns), catalog_owners_key(ns)]
        keys += [catalog_workers_key(ns, name) for name in served]
        keys += [catalog_schemas_key(ns, name) for name in served]
        lifetime_ms = max(1, int(self.worker_ttl_s * 3000))
        args: list[Any] = [repr(now), repr(now - self.worker_ttl_s), self.worker_id, lifetime_ms]
        group = group_of_namespace(ns)  # on a cluster, entries name their group
        tagged = {} if group is None else {"group": group}
        for name, item in served.items():
            entry = codec.dumps(
                {**self.registry.catalog_entry(item).model_dump(mode="json"), **tagged}
            )
            args += [name, item.identity, entry, item.schema_hash]
        return keys, args

    def _note_contested(self, contested: dict[str, str], served: dict[str, ServedTool]) -> None:
        """Keep the names this worker was refused, and report the new and the settled ones."""
        from toolfleet.worker.supervision import metrics  # the worker process loads it

        before = self.registry.contested
        self.registry.contested = contested
        for name in sorted(set(contested) - set(before)):
            mine = served[name].identity if name in served else "?"
            log.error("extension problem: %s", contested_message(name, contested[name], mine))
            metrics.CATALOG_COLLISIONS.labels(name).set(1)
            self._post_collision(name, contested[name], mine)
        for name in sorted(set(before) - set(contested)):
            metrics.CATALOG_COLLISIONS.labels(name).set(0)

    def _post_collision(self, name: str, owner: str, mine: str) -> None:
        event = {"kind": "collision", "at": time.time(), "function": name, "owner": owner,
                 "refused": mine, "worker": self.worker_id}  # fmt: skip
        try:
            self.client.xadd(events_key(self.namespace), {"event": codec.dumps(event)},
                             maxlen=100_000, approximate=True)  # fmt: skip
        except redis.RedisError as exc:
            log.warning("collision event not posted: %s", exc)

    def _beat(self, now: float) -> None:
        """Heartbeats, worker info, extension errors, MCP states and aggregates (one round trip).

        Its time is the ``rtt_ms`` the next beat's :class:`WorkerInfo` says.
        """
        pipe = self.client.pipeline(transaction=False)
        if self.registry.mcp is not None:
            servers = self.registry.mcp.status()
            for state in servers.values():
                state["last_error"] = self.registry.redactor.scrub(state["last_error"])
            report = codec.dumps({"at": now, "servers": servers})
            pipe.hset(mcp_servers_key(self.namespace), self.worker_id, report)
        errors = {k: self.registry.redactor.scrub(v) for k, v in self.registry.errors.items()}
        for name, owner in self.registry.contested.items():
            item = self.registry.served.get(name)
            mine = item.identity if item is not None else "?"
            errors[f"name {name}"] = contested_message(name, owner, mine)
        errors_report = WorkerErrors(at=now, errors=errors).model_dump_json()
        pipe.hset(extension_errors_key(self.namespace), self.worker_id, errors_report)
        for queue in self.queues:
            key = workers_key(self.namespace, queue)
            pipe.zadd(key, {self.worker_id: now})
            pipe.zremrangebyscore(key, "-inf", now - self.worker_ttl_s * 3)
        if self.janitor is not None:
            self.janitor.register(pipe)
        # the in-flight hash's TTL, here rather than at every claim (see INFLIGHT_TTL_S)
        pipe.expire(inflight_key(self.namespace, self.worker_id), INFLIGHT_TTL_S)
        if self.broker is not None:
            pipe.zadd(
                broker_heartbeats_key(self.namespace), {self.broker.broker_id: int(now * 1000)}
            )
            pipe.hset(brokers_key(self.namespace), self.worker_id, self.broker.broker_id)
            # written at start already; again here for a Redis that lost its data
            record_broker_queues(pipe, self.namespace, self.broker.broker_id, self.queues)
        pipe.hset(worker_info_key(self.namespace), self.worker_id, self._info(now))
        drained = self._drain_into(pipe)
        sent = time.perf_counter()
        try:
            pipe.execute()
        except BaseException:
            self._restore(drained)
            raise
        self._rtt_ms = (time.perf_counter() - sent) * 1000

    def _info(self, now: float) -> str:
        return WorkerInfo(
            worker_id=self.worker_id,
            supervisor=self._supervisor,
            at=now,
            queues=tuple(self.queues),
            threads=self.threads,
            version=_version(),
            rtt_ms=None if self._rtt_ms is None else round(self._rtt_ms, 3),
        ).model_dump_json()

    def _prune_infos(self, now: float) -> None:
        """Remove the worker info of processes that stopped beating.

        A killed process never withdraws its own: one ``HGETALL`` every 5th beat, over
        about one field per live process.
        """
        key = worker_info_key(self.namespace)
        raw: Any = self.client.hgetall(key)
        gone = stale_ids(parse_worker_infos(raw), now, self.worker_ttl_s)
        if gone:
            self.client.hdel(key, *gone)

    def _drain_into(self, pipe: Any) -> tuple[agg.Pending, list[dict[str, Any]]]:
        """Queue the aggregates and failures counted since the last beat on ``pipe``."""
        drained: agg.Pending = {}
        failed: list[dict[str, Any]] = []
        if self.aggregates is not None:
            drained = self.aggregates.drain()
            agg.write(pipe, self.namespace, drained, self.aggregates_ttl_s)
        if self.failures is not None:
            failed = self.failures.drain()
            fl.write(pipe, self.namespace, failed, self.failures_retention_s, self.failures_max)
        return drained, failed

    def _restore(self, drained: tuple[agg.Pending, list[dict[str, Any]]]) -> None:
        """Keep what :meth:`_drain_into` took for the next beat (its write failed)."""
        counts, failed = drained
        if counts and self.aggregates is not None:
            self.aggregates.restore(counts)
        if failed and self.failures is not None:
            self.failures.restore(failed)

    def flush_aggregates(self) -> None:
        """Write the calls counted since the last beat now (at drain, after the last call).

        Their aggregates and failures, in one round trip.

        Raises:
            redis.RedisError: Redis failed (the counts are kept for a later try).
        """
        pipe = self.client.pipeline(transaction=False)
        drained = self._drain_into(pipe)
        if not drained[0] and not drained[1]:
            return
        try:
            pipe.execute()
        except BaseException:
            self._restore(drained)
            raise

    def withdraw(self) -> None:
        """Remove this worker's heartbeats, schemas and error report (on shutdown).

        From every queue's live set and every served name's schemas set.
        """
        pipe = pipeline(self.client)
        for queue in self.queues:
            pipe.zrem(workers_key(self.namespace, queue), self.worker_id)
        for name, item in self.registry.served.items():
            if item.queue in self.queues:
                member = f"{item.schema_hash} {self.worker_id}"
                pipe.zrem(catalog_schemas_key(self.namespace, name), member)
        pipe.hdel(mcp_servers_key(self.namespace), self.worker_id)
        pipe.hdel(extension_errors_key(self.namespace), self.worker_id)
        pipe.hdel(worker_info_key(self.namespace), self.worker_id)
        pipe.execute()

    def start(self) -> None:
        """Publish now, then keep publishing on a daemon thread."""
        self.publish()
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and withdraw the heartbeats.

        Does not wait for a beat in progress (a tool holding the GIL may keep it from
        ending): a beat that ends after this withdraws what it wrote itself (:meth:`_run`).
        """
        self._stop.set()
        try:
            self.withdraw()
        except redis.RedisError as exc:
            log.warning("could not withdraw heartbeats: %s", exc)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.publish()
                if self._stop.is_set():  # stopped during the beat: it wrote them back
                    self.withdraw()
            except redis.RedisError as exc:
                log.warning("catalog heartbeat failed: %s", exc)


@functools.cache
def _version() -> str:
    """The installed toolfleet distribution's version ("" when it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("toolfleet")
    except PackageNotFoundError:
        return ""
