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
The same step (:func:`requeue_acks`) serves the periodic maintenance
(:mod:`.maintenance`), which finds brokers dead by their heartbeat instead.

The calls the dead process had claimed (were running) get the crash rule in the same
script (:mod:`.crash_rule`): counted per call id, and one whose runs ended their process
more than ``crash_reruns + 1`` times is answered ``crashed`` and dead-lettered there
instead of given back.

The dead process's calls also give back their concurrency slots in that step
(:func:`forget_calls`): its in-flight records name each call (the slot's holder) and its
tool (the slot set), so the slots are free before its messages are requeued, and calls
waiting for them run at once instead of after the leases end (up to the tool's time limit
plus a margin; see :mod:`toolfleet.worker.tenancy.concurrency`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable

import redis
from pydantic import ValidationError

from toolfleet.shared import scripts
from toolfleet.shared.naming import (
    SLOT_INFIX,
    acks_key,
    broker_heartbeats_key,
    broker_queues_key,
    brokers_key,
    concurrency_key,
    inflight_key,
    workers_key,
)
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.text import as_text
from toolfleet.worker.messaging.crash_rule import CrashRule, requeue_with_crash_rule
from toolfleet.worker.pipeline.ledger import InFlight

__all__ = ["CrashRule", "forget_calls", "recorded_queues", "recover_dead_worker", "requeue_acks"]

log = logging.getLogger("toolfleet.worker.recovery")

#: ``forget_calls.lua`` (what it takes and returns is written at its head).
_FORGET_CALLS = scripts.source("forget_calls")


def requeue_acks(
    client: redis.Redis,
    namespace: str,
    broker_id: str,
    queues: Iterable[str],
    *,
    worker_id: str | None = None,
    rule: CrashRule | None = None,
) -> int:
    """Give broker ``broker_id``'s acks sets of ``queues`` back at their queues' head.

    One ``requeue_at_head.lua`` call: an id goes back only if its message still exists,
    and each acks set is deleted. Missing sets cost nothing but their keys. With
    ``worker_id``, the calls that process had claimed get the crash rule in the same
    script (:mod:`.crash_rule`): one past ``rule.reruns`` re-runs is answered
    ``crashed`` and dead-lettered instead of given back.

    Args:
        client: Redis client.
        namespace: the broker's namespace (Dramatiq's; the group's on a cluster).
        broker_id: Dramatiq's ``broker_id`` of the dead broker.
        queues: the queues whose acks sets are given back.
        worker_id: the dead process's worker id (``host:pid``), when known.
        rule: the crash rule (None: the environment's settings).

    Returns:
        How many messages went back to their queues.

    Raises:
        redis.RedisError: Redis failed.
    """
    return requeue_with_crash_rule(client, namespace, broker_id, list(queues), worker_id, rule)


def recorded_queues(raw: bytes | str | None) -> list[str] | None:
    """The queues of a :func:`~toolfleet.shared.naming.broker_queues_key` entry.

    Returns:
        The names, or None when there is no entry or it is not a JSON list of strings.
    """
    if raw is None:
        return None
    try:
        value = json.loads(as_text(raw))
    except ValueError:
        return None
    if not isinstance(value, list) or not all(isinstance(q, str) for q in value):
        return None
    return value


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


def recover_dead_worker(
    client: redis.Redis,
    namespace: str,
    worker_id: str,
    rule: CrashRule | None = None,
    *,
    stand_in: str | None = None,
) -> int:
    """Requeue the unacknowledged messages of dead process ``worker_id`` at their queues' head.

    The calls it had claimed get the crash rule (:mod:`.crash_rule`; ``rule`` None: the
    environment's settings).

    ``stand_in``, when given, is a member that takes the dead process's place in the
    live-worker set of each shared queue it consumed (not its slot queues), with the
    current time as its heartbeat, in the same transaction that removes it: a supervisor
    restarting the process says so, and calls published meanwhile queue for the new
    process instead of being refused ``not_available`` for the second or two the restart
    takes. Nothing refreshes it: it stops counting as live after ``worker_ttl_s``.

    Its calls' concurrency slots are freed first (:func:`forget_calls`). Its broker's acks
    sets and its places in the queues' live-worker sets are those of the queues its worker
    recorded at start (:func:`~toolfleet.shared.naming.broker_queues_key`), found by
    ``SCAN`` only for a worker that wrote no record.

    Returns:
        How many messages went back to their queues.

    Raises:
        redis.RedisError: Redis failed.
    """
    broker_id = client.hget(brokers_key(namespace), worker_id)
    forget_calls(client, namespace, worker_id)  # nothing runs there any more
    dead = None if broker_id is None else as_text(broker_id)
    queues = (
        None if dead is None else recorded_queues(client.hget(broker_queues_key(namespace), dead))
    )
    if queues is None:  # no record of its queues (an older worker): find its sets by SCAN
        for key in client.scan_iter(match=workers_key(namespace, "*"), count=1000):
            client.zrem(key, worker_id)
    else:
        pipe = pipeline(client, transaction=True)
        for queue in queues:
            pipe.zrem(workers_key(namespace, queue), worker_id)
            if stand_in and not queue.endswith(".DQ") and SLOT_INFIX not in queue:
                pipe.zadd(workers_key(namespace, queue), {stand_in: time.time()})
        pipe.execute()
    if dead is None:
        return 0
    if queues is None:
        prefix = acks_key(namespace, dead, "")
        found = client.scan_iter(match=f"{prefix}*", count=1000)
        queues = [as_text(key)[len(prefix) :] for key in found]
    moved = requeue_acks(client, namespace, dead, queues, worker_id=worker_id, rule=rule)
    client.zrem(broker_heartbeats_key(namespace), dead)
    client.hdel(broker_queues_key(namespace), dead)  # the record of its queues goes with it
    client.hdel(brokers_key(namespace), worker_id)
    if moved:
        log.warning("requeued %d messages of dead worker %s", moved, worker_id)
    return moved
