"""Hand a dead worker process's messages back to their queues at once.

Dramatiq returns a dead worker's unacknowledged messages only after its heartbeat
timeout and a random maintenance pass. When the supervisor sees one of its processes
die (OOM, segfault, SIGKILL) it knows at once, so it requeues that process's fetched
messages with Dramatiq's own ``requeue`` script command and removes its heartbeats. The
next worker to take such a message finds its claim without an outcome and answers it
(re-run if the tool is idempotent, else ``crashed``; see :mod:`.ledger`).
"""

from __future__ import annotations

import logging

import redis
from dramatiq.brokers.redis import RedisBroker

from toolfleet.shared.naming import brokers_key

__all__ = ["recover_dead_worker"]

log = logging.getLogger("toolfleet.worker.recovery")


def recover_dead_worker(client: redis.Redis, namespace: str, worker_id: str) -> int:
    """Requeue the unacknowledged messages of dead process ``worker_id``.

    Returns:
        How many messages went back to their queues.
    """
    broker_id = client.hget(brokers_key(namespace), worker_id)
    for key in client.scan_iter(match=f"{namespace}:workers:*", count=1000):
        client.zrem(key, worker_id)
    if broker_id is None:
        return 0
    dead = broker_id.decode() if isinstance(broker_id, bytes) else str(broker_id)
    broker = RedisBroker(client=client, namespace=namespace, middleware=[])  # type: ignore[no-untyped-call]
    broker.broker_id = dead  # requeue acts on this broker's acknowledgement sets
    prefix = f"{namespace}:__acks__.{dead}."
    moved = 0
    for key in list(client.scan_iter(match=f"{prefix}*", count=1000)):
        queue = (key.decode() if isinstance(key, bytes) else str(key))[len(prefix) :]
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in client.smembers(key)]
        if ids:
            broker.do_requeue(queue, *ids)
            moved += len(ids)
    client.zrem(f"{namespace}:__heartbeats__", dead)
    client.hdel(brokers_key(namespace), worker_id)
    if moved:
        log.warning("requeued %d messages of dead worker %s", moved, worker_id)
    return moved
