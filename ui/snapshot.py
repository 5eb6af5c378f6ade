"""One read of the fleet for the ops page: a :class:`Snapshot`, from a bounded set of reads.

Everything comes from what the fleet keeps in Redis: the catalog, heartbeats and worker
infos, the switches, limits and breakers, the queues' heads, the dead-letter sets, the
failures index and the per-minute aggregates (:mod:`toolfleet.ui.activity`).
Nothing is remembered between reads, so a restarted ``ui`` process shows the same
numbers, and nothing is scanned: the commands one read sends depend on how many queues,
functions and worker processes the fleet has, never on how many calls it ran (the
figures are in ``docs/ui.md``). Four pipelined round trips:

1. catalog, switches, limits, worker infos and the newest failed calls (the failures
   index, :mod:`toolfleet.shared.failures`);
2. per queue: live workers, depth, dead letters (the newest :data:`DEAD_LETTERS_SHOWN`
   ids), the head of each lane (the ``queue_heads`` script of
   :mod:`toolfleet.shared.scripts`); per function: breaker and held concurrency slots;
   per worker: calls in flight;
3. the per-minute aggregates of the last hour (one ``HGETALL`` per minute);
4. the bodies of the dead letters shown (one ``HMGET`` per queue that has any).

On a Redis Cluster the keys live where :class:`~toolfleet.shared.layout.KeyLayout`
says: catalog, heartbeats and the fleet copies of switches and limits in the fleet's
slot; each queue's keys, its functions' breakers and slots, and each group's worker
infos, failures index and aggregates in the slot of the queue's group (which the catalog
entries name). The worker infos and failures of every group are then read in a round
trip of their own, after the catalog has named the groups; the failures of all groups
are merged, newest first. The commands are sent in order through
:func:`toolfleet.shared.pipelines.pipeline` (redis-py's cluster pipeline refuses
``EVALSHA``); still none is a ``KEYS`` or a ``SCAN``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from toolfleet.shared import codec, scripts
from toolfleet.shared.catalog import CatalogEntry
from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.naming import (
    catalog_key,
    concurrency_key,
    dead_letters_key,
    failures_key,
    inflight_key,
    queue_key,
    queue_msgs_key,
    switches_key,
    worker_info_key,
    workers_key,
)
from toolfleet.shared.pipelines import InOrder, pipeline
from toolfleet.shared.tenancy.breakers import breaker_key
from toolfleet.shared.tenancy.lanes import lane_keys, uses_lanes
from toolfleet.shared.tenancy.quotas import Quota, limits_key
from toolfleet.shared.text import as_text
from toolfleet.shared.worker_info import WorkerInfo, parse_worker_infos
from toolfleet.ui.activity import Activity, ToolActivity, read_activity
from toolfleet.ui.dead_letters import DeadLetter, parse_dead_letter

__all__ = [
    "DEAD_LETTERS_SHOWN",
    "FAILURES_READ",
    "Breaker",
    "Failure",
    "QueueState",
    "Snapshot",
    "WorkerState",
    "parse_failures",
    "read_snapshot",
]

#: Newest failed calls read per refresh from the failures index (the failures page lists
#: these; a search reads the whole index, :func:`toolfleet.shared.failures.search`).
FAILURES_READ = 100
#: Newest dead letters shown per queue.
DEAD_LETTERS_SHOWN = 20

#: The waiting calls of one queue: lengths and the oldest entry's send time.
_QUEUE_HEADS = scripts.script("queue_heads")


@dataclass(frozen=True)
class QueueState:
    """One queue now.

    Attributes:
        name: the Dramatiq queue name.
        depth: calls it holds (waiting, prefetched and running: Dramatiq's ``.msgs``).
        waiting: entries on the queue list (ids, or one token per call waiting in a lane).
        oldest_age_s: seconds since the oldest waiting call was sent (None: none waits).
        lanes: calls waiting per lane, lane 0 first (empty for a queue without lanes).
        dead_letters: dead-lettered messages.
        live_workers: worker processes that beat within the worker TTL.
    """

    name: str
    depth: int
    waiting: int
    oldest_age_s: float | None
    lanes: tuple[int, ...]
    dead_letters: int
    live_workers: int

    @property
    def busy_lanes(self) -> int:
        """Lanes holding at least one call."""
        return sum(1 for n in self.lanes if n)


@dataclass(frozen=True)
class WorkerState:
    """One worker process: its last heartbeat and the calls it runs now."""

    info: WorkerInfo
    heartbeat_age_s: float
    in_flight: int
    live: bool


@dataclass(frozen=True)
class Breaker:
    """A function's breaker and concurrency slots (only non-trivial ones are listed)."""

    function: str
    state: str
    failures: int
    next_probe_in_s: float | None
    slots_held: int


@dataclass(frozen=True)
class Failure:
    """A failed call, any status but ``ok``, from the failures index (no secret in it)."""

    id: str
    function: str
    account: str | None
    status: str
    error: str
    worker: str
    at: float


@dataclass(frozen=True)
class Snapshot:
    """The fleet at ``taken_at`` (Unix epoch seconds), as every page shows it.

    ``queue_prefixes`` maps each catalogued queue to the prefix of its keys and
    ``group_prefixes`` lists every group's prefix read (on a plain Redis, both name the
    namespace only).
    """

    taken_at: float
    namespace: str
    queues: tuple[QueueState, ...]
    workers: tuple[WorkerState, ...]
    catalog: tuple[CatalogEntry, ...]
    switches: dict[str, str]
    declared_switches: dict[str, bool]
    quotas: dict[str, Quota]
    breakers: tuple[Breaker, ...]
    failures: tuple[Failure, ...]
    dead_letters: tuple[DeadLetter, ...]
    activity: Activity
    queue_prefixes: dict[str, str] = field(default_factory=dict)
    group_prefixes: tuple[str, ...] = ()

    def prefix_of(self, queue: str) -> str:
        """The key prefix of ``queue``'s keys (its group's on a cluster, else the namespace)."""
        return self.queue_prefixes.get(queue, self.namespace)

    @property
    def verdict(self) -> tuple[str, str]:
        """``(level, sentence)``: ``ok``, ``warn`` or ``bad`` and why, the worst first."""
        if not self.catalog:
            return "warn", "no tools catalogued: no worker has published yet"
        unserved = [q.name for q in self.queues if q.depth and not q.live_workers]
        if unserved:
            return "bad", f"calls wait on {', '.join(unserved)} with no live worker"
        stale = [q.name for q in self.queues if (q.oldest_age_s or 0) > 60]
        if stale:
            return "warn", f"a call has waited over 60 s on {', '.join(stale)}"
        opened = [b.function for b in self.breakers if b.state != "closed"]
        if opened:
            return "warn", f"breaker open for {', '.join(opened)}"
        if any(q.dead_letters for q in self.queues):
            return "warn", "dead letters are waiting for an operator"
        return "ok", "every queue is served and nothing waits long"

    @property
    def queues_worst_first(self) -> list[QueueState]:
        """Queues by how bad they look: unserved, then oldest waiting call, then depth."""
        return sorted(
            self.queues,
            key=lambda q: (bool(q.depth and not q.live_workers), q.oldest_age_s or 0, q.depth),
            reverse=True,
        )

    def tool(self, name: str) -> ToolActivity | None:
        """The aggregates of function ``name`` (None when it ran no call in the window)."""
        return self.activity.tools.get(name)


def read_snapshot(
    client: redis.Redis,
    namespace: str,
    *,
    worker_ttl_s: float = 10.0,
    now: float | None = None,
) -> Snapshot:
    """Read the fleet once: four pipelined round trips, five on a cluster (module docstring).

    Args:
        client: a Redis client of the fleet (``redis.Redis`` or a cluster client).
        namespace: the fleet's namespace.
        worker_ttl_s: a worker that has not beaten for this many seconds is not live.
        now: the current time, Unix epoch seconds (default: the clock).

    Raises:
        redis.RedisError: Redis failed.
    """
    now = time.time() if now is None else now
    layout = KeyLayout.of(client, namespace)
    fleet = layout.fleet
    first = pipeline(client)
    first.hgetall(catalog_key(fleet))
    first.hgetall(switches_key(fleet))
    first.hgetall(limits_key(fleet))
    if not layout.cluster:  # one prefix, known before the catalog is read
        _queue_group_reads(first, [namespace])
    replies = first.execute()
    raw_catalog, raw_switches, raw_limits = replies[:3]
    decoded = _decoded(raw_catalog)
    layout.learn(decoded)
    catalog = _catalog(decoded)
    queues = sorted({entry.queue for entry in catalog})
    functions = sorted(entry.name for entry in catalog)
    queue_of = {entry.name: entry.queue for entry in catalog}
    prefixes = layout.prefixes()
    if layout.cluster:
        grouped = pipeline(client)
        _queue_group_reads(grouped, prefixes)
        replies = [*replies[:3], *grouped.execute()]
    infos, info_prefixes, raw_failures = _group_replies(prefixes, replies[3:])
    of_queue = {queue: layout.of_queue(queue) for queue in queues}

    second = pipeline(client)
    for queue in queues:
        prefix = of_queue[queue]
        second.zcount(workers_key(fleet, queue), now - worker_ttl_s, "+inf")
        second.hlen(queue_msgs_key(prefix, queue))
        second.zcard(dead_letters_key(prefix, queue))
        second.zrevrange(dead_letters_key(prefix, queue), 0, DEAD_LETTERS_SHOWN - 1)
        lanes = lane_keys(prefix, queue) if uses_lanes(queue) else []
        _queue_heads(second, client, [queue_key(prefix, queue), queue_msgs_key(prefix, queue),
                                      *lanes])  # fmt: skip
    for function in functions:
        prefix = of_queue[queue_of[function]]
        second.hgetall(breaker_key(prefix, function))
        second.zcount(concurrency_key(prefix, function), int(now * 1000), "+inf")
    for info, prefix in zip(infos, info_prefixes, strict=True):
        second.hlen(inflight_key(prefix, info.worker_id))
    values: list[Any] = second.execute()
    activity = read_activity(client, prefixes, now)

    queue_states, dead_ids = _queues(queues, values, now)
    rest = values[5 * len(queues) :]
    breakers = _breakers(functions, rest[: 2 * len(functions)], now)
    in_flight = rest[2 * len(functions) : 2 * len(functions) + len(infos)]

    third = pipeline(client)
    shown = [(queue, ids) for queue, ids in dead_ids if ids]
    for queue, ids in shown:
        third.hmget(dead_letters_key(of_queue[queue], queue) + ".msgs", ids)
    bodies: list[Any] = third.execute() if shown else []
    dead: list[DeadLetter] = []
    for (queue, ids), found in zip(shown, bodies, strict=True):
        for redis_id, body in zip(ids, found, strict=True):
            dead.append(parse_dead_letter(queue, redis_id, body))

    workers = tuple(
        WorkerState(info, max(0.0, now - info.at), int(n), now - info.at <= worker_ttl_s)
        for info, n in zip(infos, in_flight, strict=True)
    )
    return Snapshot(
        taken_at=now,
        namespace=namespace,
        queues=tuple(queue_states),
        workers=workers,
        catalog=tuple(catalog),
        switches={as_text(k): as_text(v) for k, v in raw_switches.items()},
        declared_switches=_declared(catalog),
        quotas=_quotas(raw_limits),
        breakers=tuple(breakers),
        failures=tuple(parse_failures(raw_failures)),
        dead_letters=tuple(dead),
        activity=activity,
        queue_prefixes=of_queue,
        group_prefixes=tuple(prefixes),
    )


def _queue_group_reads(pipe: Any, prefixes: Sequence[str]) -> None:
    """Queue each group's worker infos and newest failures on ``pipe`` (two commands a group)."""
    for prefix in prefixes:
        pipe.hgetall(worker_info_key(prefix))
        pipe.zrevrange(failures_key(prefix), 0, FAILURES_READ - 1)


def _group_replies(
    prefixes: Sequence[str], replies: Sequence[Any]
) -> tuple[list[WorkerInfo], list[str], list[Any]]:
    """The worker infos (with each one's group prefix) and the newest failures of all groups.

    Failures of several groups are merged (:func:`parse_failures` orders them newest first).
    """
    infos: list[WorkerInfo] = []
    info_prefixes: list[str] = []
    events: list[Any] = []
    for i, prefix in enumerate(prefixes):
        raw_infos, raw_failures = replies[2 * i : 2 * i + 2]
        found = parse_worker_infos(raw_infos)
        infos += found
        info_prefixes += [prefix] * len(found)
        events += raw_failures
    return infos, info_prefixes, events


def _queue_heads(pipe: Any, client: Any, keys: list[str]) -> None:
    """Queue the ``queue_heads`` script on ``pipe``.

    A redis-py pipeline registers the script and loads it if Redis lacks it; an
    :class:`~toolfleet.shared.pipelines.InOrder` one (a cluster) runs it through
    ``client`` when its turn comes, which loads it on a ``NOSCRIPT`` the same way.
    """
    if isinstance(pipe, InOrder):
        pipe.command_stack.append((_QUEUE_HEADS, (), {"keys": keys, "client": client}))
    else:
        _QUEUE_HEADS(keys=keys, client=pipe)


def _decoded(raw: dict[bytes, bytes]) -> dict[str, dict[str, Any]]:
    """The catalog's entries as read: function name -> decoded JSON object."""
    entries: dict[str, dict[str, Any]] = {}
    for name, value in raw.items():
        try:
            entry = codec.loads(value)
        except codec.DecodeError:
            continue
        if isinstance(entry, dict):
            entries[as_text(name)] = entry
    return entries


def _catalog(decoded: dict[str, dict[str, Any]]) -> list[CatalogEntry]:
    entries = []
    for value in decoded.values():
        try:
            entries.append(CatalogEntry.model_validate(value))
        except ValueError:
            continue
    return sorted(entries, key=lambda entry: entry.name)


def _queues(
    queues: list[str], values: list[Any], now: float
) -> tuple[list[QueueState], list[tuple[str, list[str]]]]:
    states = []
    dead_ids = []
    for i, queue in enumerate(queues):
        live, depth, dead, ids, heads = values[5 * i : 5 * i + 5]
        sent_ms = int(heads[1])
        states.append(
            QueueState(
                name=queue,
                depth=int(depth),
                waiting=int(heads[0]),
                oldest_age_s=None if sent_ms < 0 else max(0.0, now - sent_ms / 1000),
                lanes=tuple(int(n) for n in heads[2:]),
                dead_letters=int(dead),
                live_workers=int(live),
            )
        )
        dead_ids.append((queue, [as_text(x) for x in ids]))
    return states, dead_ids


def _breakers(functions: list[str], values: list[Any], now: float) -> list[Breaker]:
    found = []
    for i, function in enumerate(functions):
        state: dict[bytes, bytes] = values[2 * i]
        held = int(values[2 * i + 1])
        name = state.get(b"state", b"closed").decode()
        if name == "closed" and not held and not state.get(b"failures"):
            continue
        until = float(state.get(b"until", b"0") or 0)
        found.append(
            Breaker(
                function=function,
                state=name,
                failures=int(float(state.get(b"failures", b"0") or 0)),
                next_probe_in_s=max(0.0, until / 1000 - now) if name != "closed" else None,
                slots_held=held,
            )
        )
    return found


def parse_failures(members: Sequence[Any]) -> list[Failure]:
    """:class:`Failure` rows of failures index members (or records), newest first.

    At most :data:`FAILURES_READ`; members that do not decode are skipped.
    """
    found = []
    for member in members:
        try:
            event = member if isinstance(member, dict) else codec.loads(member)
        except codec.DecodeError:
            continue
        if not isinstance(event, dict) or "id" not in event:
            continue
        found.append(
            Failure(
                id=str(event.get("id", "")),
                function=str(event.get("function", "")),
                account=event.get("account"),
                status=str(event.get("status")),
                error=str(event.get("error") or ""),
                worker=str(event.get("worker", "")),
                at=float(event.get("at") or 0),
            )
        )
    found.sort(key=lambda f: -f.at)
    return found[:FAILURES_READ]


def _declared(catalog: list[CatalogEntry]) -> dict[str, bool]:
    declared: dict[str, bool] = {}
    for entry in catalog:
        for switch in entry.switches:
            declared[switch.name] = switch.default
    return declared


def _quotas(raw: dict[bytes, bytes]) -> dict[str, Quota]:
    found = {}
    for scope, data in sorted(raw.items()):
        try:
            found[as_text(scope)] = Quota.model_validate_json(data)
        except ValueError:
            continue
    return found
