"""Hand a dead worker process's messages back to their queues at once, at the head.

Dramatiq returns a dead worker's unacknowledged messages only after its heartbeat
timeout and a random maintenance pass. When the supervisor sees one of its processes
die (OOM, segfault, SIGKILL) it knows at once, so it puts that process's fetched
messages back and removes its heartbeats. The next worker to take such a message finds
its claim without an outcome and answers it (re-run if the tool is idempotent, else
``crashed``; see :mod:`.ledger`).

The messages go back to the *head* of their queue (``LPUSH``), not the tail as
Dramatiq's own ``requeue`` command does: they were fetched before everything still
queued, so at the tail they would wait for the whole backlog (measured: 3.8 s behind 700
short calls, and past their deadline behind a long backlog) while later calls are
served first. The script keeps Dramatiq's key layout and semantics otherwise: an id
leaves the dead broker's acknowledgement set and returns only if its message still exists.

The dead process's calls also give back their concurrency slots in that step
(:func:`forget_calls`): its in-flight records name each call (the slot's holder) and its
tool (the slot set), so the slots are free before its messages are requeued, and calls
waiting for them run at once instead of after the leases end (up to the tool's time limit
plus a margin; see :mod:`toolfleet.worker.tenancy.concurrency`).
"""

from __future__ import annotations

import logging

import redis
from pydantic import ValidationError

from toolfleet.shared import scripts
from toolfleet.shared.naming import (
    acks_key,
    broker_heartbeats_key,
    broker_queues_key,
    brokers_key,
    concurrency_key,
    inflight_key,
    queue_key,
    queue_msgs_key,
    workers_key,
)
from toolfleet.shared.text import as_text
from toolfleet.worker.pipeline.ledger import InFlight

__all__ = ["forget_calls", "recover_dead_worker"]

log = logging.getLogger("toolfleet.worker.recovery")

#: ``requeue_at_head.lua`` (what it takes and returns is written at its head).
_REQUEUE_AT_HEAD = scripts.source("requeue_at_head")

#: ``forget_calls.lua`` (what it takes and returns is written at its head).
_FORGET_CALLS = scripts.source("forget_calls")


def forget_calls(client: redis.Redis, namespace: str, worker_id: str) -> int:
    """Drop the in-flight records of process ``worker_id`` and free its calls' slots.

    For a process that is dead, or about to be killed: nothing runs its calls any more.
    One read of its in-flight hash, then one script that removes each call's concurrency
    lease (holder: the call id) and the hash together.

    Args:
        client: Redis client.
        namespace: key prefix.
        worker_id: the process's id (``host:pid``).

    Returns:
        How many concurrency leases were freed.

    Raises:
        redis.RedisError: Redis failed.
    """
    key = inflight_key(namespace, worker_id)
    calls: list[InFlight] = []
    for raw in client.hvals(key):
        try:
            calls.append(InFlight.model_validate_json(raw))
        except ValidationError:
            continue
    slot_sets = [concurrency_key(namespace, call.function) for call in calls]
    forget = client.register_script(_FORGET_CALLS)
    freed = int(forget(keys=[key, *slot_sets], args=[call.id for call in calls]))
    if freed:
        log.warning("freed %d concurrency slots of dead worker %s", freed, worker_id)
    return freed


def recover_dead_worker(client: redis.Redis, namespace: str, worker_id: str) -> int:
    """Requeue the unacknowledged messages of dead process ``worker_id`` at their queues' head.

    Its calls' concurrency slots are freed first (:func:`forget_calls`).

    Returns:
        How many messages went back to their queues.

    Raises:
        redis.RedisError: Redis failed.
    """
    broker_id = client.hget(brokers_key(namespace), worker_id)
    forget_calls(client, namespace, worker_id)  # nothing runs there any more
    for key in client.scan_iter(match=workers_key(namespace, "*"), count=1000):
        client.zrem(key, worker_id)
    if broker_id is None:
        return 0
    dead = as_text(broker_id)
    requeue = client.register_script(_REQUEUE_AT_HEAD)
    prefix = acks_key(namespace, dead, "")
    moved = 0
    for key in list(client.scan_iter(match=f"{prefix}*", count=1000)):
        queue = as_text(key)[len(prefix) :]
        keys = [key, queue_key(namespace, queue), queue_msgs_key(namespace, queue)]
        moved += int(requeue(keys=keys))
    client.zrem(broker_heartbeats_key(namespace), dead)
    client.hdel(broker_queues_key(namespace), dead)  # the record of its queues goes with it
    client.hdel(brokers_key(namespace), worker_id)
    if moved:
        log.warning("requeued %d messages of dead worker %s", moved, worker_id)
    return moved
