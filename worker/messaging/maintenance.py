"""toolfleet's own Dramatiq maintenance: dead brokers' messages back, old dead letters gone.

Dramatiq's Redis broker does this inside its ``dispatch.lua``, on a random share of its
commands (``maintenance_chance``): it requeues the unacknowledged messages of brokers
whose heartbeat is older than ``heartbeat_timeout``, asks ``KEYS <ns>:__acks__.<dead>*``
whether any of a dead broker's acks sets is left before it drops its heartbeat, and
expires dead letters older than ``dead_message_ttl``; it builds every one of those keys
from the namespace inside Lua. ``KEYS`` walks the whole keyspace (a stall of the server
on a large one), and keys a script builds itself cannot be routed on a Redis Cluster. So
toolfleet's brokers run none of it (:func:`~toolfleet.worker.messaging.broker.make_broker`
sets ``maintenance_chance`` to 0) and every worker runs :func:`run_maintenance` instead,
with the same semantics and Dramatiq's key layout, every key declared:

1. the dead brokers are read client-side (``ZRANGEBYSCORE`` of
   :func:`~toolfleet.shared.naming.broker_heartbeats_key` up to now minus the timeout);
2. each dead broker's acks set of every queue it consumed goes back to that queue, at its
   head, the calls its process had claimed under the crash rule
   (:mod:`~toolfleet.worker.messaging.crash_rule`;
   :func:`~toolfleet.worker.messaging.recovery.requeue_acks`, the step that also
   recovers a process the supervisor saw die: the messages were fetched before everything
   still queued). Which queues a
   broker consumed is recorded when it starts (:func:`record_broker_queues`, the hash
   :func:`~toolfleet.shared.naming.broker_queues_key`); with that record its heartbeat and
   record are then dropped once none of its acks sets exists (``forget_broker.lua``). A
   broker without a record (a plain Dramatiq worker, or a toolfleet worker of a version
   that wrote none) has its acks sets of the queues given to :func:`run_maintenance`
   requeued, and its heartbeat kept: without ``KEYS`` nothing says that it left no acks
   set on another queue, and that set is found by a worker serving that queue, as
   Dramatiq's own per-queue maintenance would. Nothing is lost; such a heartbeat stays
   until Dramatiq's maintenance (of a plain Dramatiq worker) or an operator removes it;
3. each queue's dead letters older than the broker's ``dead_message_ttl`` are dropped
   from its ``.XQ`` set and ``.XQ.msgs`` hash, a batch per script call
   (``expire_dead_letters.lua``).

On a Redis Cluster the broker's namespace is its queue group's (``<ns>:{g.<group>}``), so
every key of a pass is in the group's slot, and each script declares all of its keys.
Differences from Dramatiq's script: messages go to the head of their queue, not its tail
(see :mod:`.recovery`), and the steps run in several scripts, not one (a broker that
comes back to life between the read of the heartbeats and the requeue gets its fetched
messages delivered again, as it would had it stalled a moment longer; its heartbeat is
kept, as ``forget_broker.lua`` reads it again).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name, q_name

from toolfleet.shared import scripts
from toolfleet.shared.naming import (
    acks_key,
    broker_heartbeats_key,
    broker_queues_key,
    brokers_key,
    dead_letters_key,
    queue_msgs_key,
)
from toolfleet.shared.text import as_text
from toolfleet.worker.messaging.recovery import CrashRule, recorded_queues, requeue_acks

__all__ = [
    "DEAD_LETTER_BATCH",
    "MaintenanceResult",
    "consumed_queues",
    "record_broker_queues",
    "run_maintenance",
]

log = logging.getLogger("toolfleet.worker.maintenance")

#: Most dead letters one script call drops (well inside Lua's ``unpack`` limit).
DEAD_LETTER_BATCH = 500

#: ``forget_broker.lua`` (what it takes and returns is written at its head).
_FORGET_BROKER = scripts.script("forget_broker")
#: ``expire_dead_letters.lua``.
_EXPIRE_DEAD_LETTERS = scripts.script("expire_dead_letters")


@dataclass(frozen=True)
class MaintenanceResult:
    """What one :func:`run_maintenance` pass did.

    Attributes:
        dead_brokers: how many brokers had a heartbeat older than the timeout.
        requeued: how many messages of dead brokers went back to their queues.
        forgotten: how many dead brokers had their heartbeat (and record) removed.
        expired: how many dead letters older than the TTL were dropped.
    """

    dead_brokers: int = 0
    requeued: int = 0
    forgotten: int = 0
    expired: int = 0


def consumed_queues(queues: Iterable[str]) -> list[str]:
    """The queues a Dramatiq worker consumes for ``queues``: each one and its delay queue.

    Args:
        queues: queue names, plain or delay (``.DQ``) ones.

    Returns:
        Sorted names, each plain queue followed by its ``.DQ``, without repeats.
    """
    names: set[str] = set()
    for queue in queues:
        canonical = q_name(queue)
        names.update((canonical, dq_name(canonical)))
    return sorted(names)


def record_broker_queues(
    client: redis.Redis | redis.client.Pipeline,
    namespace: str,
    broker_id: str,
    queues: Iterable[str],
) -> None:
    """Record which queues broker ``broker_id`` consumes (the delay queues added).

    Written before the broker fetches anything, so every acks set it can leave behind is
    named in the record; :func:`run_maintenance` deletes the record with the broker's
    heartbeat.

    Args:
        client: Redis client, or a pipeline the caller executes.
        namespace: the broker's namespace (Dramatiq's; the group's on a cluster).
        broker_id: Dramatiq's ``broker_id``.
        queues: the queues its worker consumes.

    Raises:
        redis.RedisError: Redis failed (only when ``client`` is not a pipeline).
    """
    value = json.dumps(consumed_queues(queues), separators=(",", ":"))
    client.hset(broker_queues_key(namespace), broker_id, value)


def _worker_ids(client: redis.Redis, namespace: str) -> dict[str, str]:
    """Broker id -> worker id (``host:pid``), from :func:`~toolfleet.shared.naming.brokers_key`.

    The crash rule needs the worker id of a dead broker (its calls' claim tokens start
    with it); read once per pass that found dead brokers.
    """
    pairs = client.hgetall(brokers_key(namespace))
    return {as_text(broker): as_text(worker) for worker, broker in pairs.items()}


def run_maintenance(
    broker: RedisBroker, queues: Iterable[str], *, now_ms: int | None = None
) -> MaintenanceResult:
    """One maintenance pass on ``broker``'s namespace (see the module's text for the rules).

    Sends no ``KEYS`` or ``SCAN``; every script declares every key it touches, all of them
    under the broker's namespace (one slot per queue group on a cluster).

    Args:
        broker: this worker's broker; its ``namespace``, ``broker_id``,
            ``heartbeat_timeout`` (ms) and ``dead_message_ttl`` (ms) are used.
        queues: the queues this worker serves (their delay queues are added): where the
            messages of a dead broker without a record are looked for, and whose dead
            letters are expired.
        now_ms: the current time, epoch milliseconds (default: the clock).

    Returns:
        What the pass did.

    Raises:
        TypeError: ``queues`` is a single string (a list of names is expected).
        redis.RedisError: Redis failed (what was done before stays done).
    """
    if isinstance(queues, str):
        raise TypeError("queues must be an iterable of queue names, not one string")
    client = broker.client
    ns = broker.namespace
    now = int(time.time() * 1000) if now_ms is None else now_ms
    cutoff = now - int(broker.heartbeat_timeout)
    served = consumed_queues(queues)
    heartbeats = broker_heartbeats_key(ns)
    records_key = broker_queues_key(ns)
    dead = [as_text(b) for b in client.zrangebyscore(heartbeats, 0, cutoff)]
    dead = [b for b in dead if b != broker.broker_id]
    requeued = forgotten = 0
    records = client.hmget(records_key, dead) if dead else []
    workers = _worker_ids(client, ns) if dead else {}
    rule = CrashRule.from_settings() if dead else None
    for dead_id, raw in zip(dead, records, strict=True):
        recorded = recorded_queues(raw)
        queues_of = served if recorded is None else recorded
        moved = requeue_acks(client, ns, dead_id, queues_of, worker_id=workers.get(dead_id),
                             rule=rule)  # fmt: skip
        requeued += moved
        if moved:
            log.warning("requeued %d messages of dead broker %s", moved, dead_id)
        if recorded is not None:
            acks = [acks_key(ns, dead_id, queue) for queue in recorded]
            keys = [heartbeats, records_key, *acks]
            forgotten += int(_FORGET_BROKER(keys=keys, args=[dead_id, cutoff], client=client))
    expired = 0
    for queue in sorted({q_name(q) for q in served}):
        letters = dead_letters_key(ns, queue)
        keys = [letters, queue_msgs_key(ns, f"{queue}.XQ")]
        expiry = now - int(broker.dead_message_ttl)
        while True:
            dropped = int(
                _EXPIRE_DEAD_LETTERS(keys=keys, args=[expiry, DEAD_LETTER_BATCH], client=client)
            )
            expired += dropped
            if dropped < DEAD_LETTER_BATCH:
                break
    return MaintenanceResult(len(dead), requeued, forgotten, expired)
