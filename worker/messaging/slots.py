"""Slot queues of session affinity: registered while served, handed back when their slot is gone.

A worker process serving a tool with session affinity also consumes a queue only its
slot consumes (:func:`toolfleet.shared.naming.affinity_queue_for`); producers send a
conversation's follow-up calls there while the slot heartbeats. A slot's replacement
process (same host, supervisor and index) serves the same queue, so its calls are never
stranded by one process dying. When the whole slot is gone (its supervisor or pod went
away) calls routed there in the moments before the producers noticed would wait for a
consumer that never comes; :class:`SlotJanitor`, run by every worker's maintenance,
moves them back to the tool's own queue once the slot's heartbeats are older than
``stale_s`` (``worker_ttl_s``: the age at which producers stop routing there), so another
worker answers them (with a fresh interpreter, which says so).

A slot of this host whose supervisor is no longer running (killed outright, its processes
with it; the host's next supervisor runs here) is gone at once, without waiting for its
heartbeats to age: its heartbeats are deleted, so that producers stop routing
conversations there (they send them to the tool's own queue, where a fresh session says
why), and the calls routed there meanwhile are handed back. Each worker process sweeps
once when it starts and then with every maintenance run.

The registry of slot queues is the hash ``<ns>:slots`` (slot queue -> the queue it stands
in for; :func:`toolfleet.shared.naming.slots_key`), written by each process every beat.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

import orjson
import redis
from dramatiq.brokers.redis import RedisBroker

from toolfleet.shared.naming import (
    actor_name_for,
    queue_key,
    queue_msgs_key,
    slot_host,
    slot_lock_key,
    slot_supervisor,
    slots_key,
    workers_key,
)
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.text import as_text
from toolfleet.worker.messaging.maintenance import run_maintenance

__all__ = ["SlotJanitor"]

log = logging.getLogger("toolfleet.worker.slots")

#: Messages moved per slot queue and maintenance run (the rest wait for the next run).
MOVE_BATCH = 500


class SlotJanitor:
    """Register this process's slot queues; hand back the queues of slots that are gone.

    Args:
        client: Redis client.
        namespace: key prefix.
        routes: this process's slot queues: queue -> slot queue.
        stale_s: seconds without a heartbeat after which a slot counts as gone.
        host: this host's name (default: ``socket.gethostname()``).
        supervisor_pid: this process's supervisor (default: its parent).
    """

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        routes: dict[str, str],
        stale_s: float,
        *,
        host: str | None = None,
        supervisor_pid: int | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.routes = dict(routes)
        self.stale_s = stale_s
        self.host = slot_host(socket.gethostname() if host is None else host)
        self.supervisor_pid = os.getppid() if supervisor_pid is None else supervisor_pid

    def register(self, pipe: redis.client.Pipeline) -> None:
        """Add this process's slot queues to the registry (in the caller's pipeline)."""
        if self.routes:
            mapping = {slot: queue for queue, slot in self.routes.items()}
            pipe.hset(slots_key(self.namespace), mapping=mapping)  # type: ignore[arg-type]

    def sweep(self, broker: RedisBroker) -> int:
        """Move the messages of gone slots' queues back to their own queues.

        Maintenance (:func:`~toolfleet.worker.messaging.maintenance.run_maintenance`) first
        gives the unacknowledged messages of the slot's dead brokers back to the slot
        queue; then each message is rewritten for the tool's own queue (``queue_name``,
        ``actor_name``) and moved. A slot with nothing left is removed from the registry.
        One worker at a time per slot (a short Redis lock).

        Returns:
            Messages moved.
        """
        registry = self.client.hgetall(slots_key(self.namespace))
        mine = set(self.routes.values())
        moved = 0
        for raw_slot, raw_queue in registry.items():
            slot, queue = as_text(raw_slot), as_text(raw_queue)
            if slot in mine:
                continue
            orphaned = self._orphaned(slot, queue)
            if not orphaned and self._alive(slot):
                continue
            lock = slot_lock_key(self.namespace, slot)
            if not self.client.set(lock, "1", nx=True, ex=30):
                continue
            try:
                if orphaned:  # producers stop routing there now, not when its beats age
                    self.client.delete(workers_key(self.namespace, slot))
                    log.info("slot queue %s: its supervisor is gone from this host", slot)
                moved += self._hand_back(broker, slot, queue)
            finally:
                self.client.delete(lock)
        return moved

    def _orphaned(self, slot: str, queue: str) -> bool:
        """True for a slot of this host whose supervisor is not running (not this one's)."""
        found = slot_supervisor(slot, queue)
        if found is None or found[0] != self.host or found[1] == self.supervisor_pid:
            return False
        return not _running(found[1])

    def _alive(self, slot: str) -> bool:
        newest = self.client.zrevrange(workers_key(self.namespace, slot), 0, 0, withscores=True)
        return bool(newest) and float(newest[0][1]) >= time.time() - self.stale_s

    def _hand_back(self, broker: RedisBroker, slot: str, queue: str) -> int:
        run_maintenance(broker, [slot])
        ns = broker.namespace
        ids = self.client.lrange(queue_key(ns, slot), 0, MOVE_BATCH - 1)
        pipe = pipeline(self.client)
        for raw_id in ids:
            message_id = as_text(raw_id)
            body = self.client.hget(queue_msgs_key(ns, slot), message_id)
            pipe.lrem(queue_key(ns, slot), 0, message_id)
            pipe.hdel(queue_msgs_key(ns, slot), message_id)
            if body is None:
                continue
            try:
                message = orjson.loads(body)
                message["queue_name"] = queue
                message["actor_name"] = actor_name_for(queue)
                rewritten = orjson.dumps(message)
            except (orjson.JSONDecodeError, TypeError):
                log.warning("dropping an undecodable message %s of slot queue %s", message_id, slot)
                continue
            pipe.hset(queue_msgs_key(ns, queue), message_id, rewritten)
            pipe.rpush(queue_key(ns, queue), message_id)
        if not ids:
            pipe.hdel(slots_key(self.namespace), slot)
            pipe.delete(workers_key(self.namespace, slot))
        pipe.execute()
        if ids:
            log.info("slot queue %s is gone: %d calls handed back to %s", slot, len(ids), queue)
        return len(ids)


def _running(pid: int) -> bool:
    """True while process ``pid`` runs on this host (a zombie does not run)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: running
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: kill(0) said it exists
    return stat.rpartition(")")[2].split()[:1] != ["Z"]
