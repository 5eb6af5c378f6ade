"""Every name toolfleet puts in Redis or on the wire, in one place.

Function names follow OpenAI's rule for tool names, ``^[a-zA-Z0-9_-]{1,64}$``;
queue names follow Dramatiq's (letters, digits, ``.``, ``_``, ``-``).

Redis keys (``ns`` is the namespace, default ``toolfleet``)::

    <ns>:<queue>                 Dramatiq's queue list (and .msgs, .XQ, .DQ beside it)
    <ns>:reply:<client_id>       a producer's reply list
    <ns>:catalog                 hash: function name -> catalog entry (JSON)
    <ns>:catalog:epoch           the catalog's epoch id (a new one: Redis lost its data)
    <ns>:catalog:recovering      set: functions served before the loss (one worker TTL)
    <ns>:catalog:live            sorted set: function name -> newest heartbeat serving it
    <ns>:catalog:owners          hash: function name -> the tool it stands for, <slug>/<tool>
    <ns>:catalog:workers:<name>  sorted set: worker id -> last heartbeat serving <name>
    <ns>:workers:<queue>         sorted set: worker id -> last heartbeat (epoch seconds)
    <ns>:switches                hash: switch name -> "on" | "off"
    <ns>:extension_errors        hash: extension source -> why it was not loaded
    <ns>:claim:<id>              the worker that took a call (before it runs)
    <ns>:outcome:<id>            a call's terminal result (for redelivered messages)
    <ns>:cancel:<id>             a canceled call; <ns>:cancel is the pub/sub channel
    <ns>:brokers                 hash: worker id -> Dramatiq broker id
    <ns>:__broker_queues__       hash: Dramatiq broker id -> the queues it consumes (JSON list)
    <ns>:inflight:<worker_id>    hash: call id -> the running call (for the watchdog)
    <ns>:events                  stream of lifecycle events (capped)
    <ns>:mcp_servers             hash: worker id -> its MCP sessions' states (JSON, with "at")
    <ns>:slots                   hash: slot queue -> the queue it stands in for (affinity)
    <ns>:worker_info             hash: worker id -> what its last heartbeat said (JSON)
    <ns>:limits                  hash: quota scope -> its quota (JSON)
    <ns>:quota:inflight:<scope>  sorted set: a scope's calls in flight -> deadline (ms)
    <ns>:quota:rate:<scope>      a scope's rate counter (theoretical arrival time, ms)
    <ns>:breaker:<function>      hash: a tool's breaker state
    <ns>:route:<digest>          a conversation's route to the process holding its session
    <ns>:idempotency:<digest>    the call an idempotency key was first used for
    <ns>:agg:<minute>            hash: one minute's call aggregates (toolfleet.shared.aggregates)

On a Redis Cluster (:func:`group_namespace` with ``cluster=True``) every key above but
the fleet-wide ones is named under ``<ns>:{g.<group>}`` (the hash tag of its queue
group: one slot per group) and the fleet-wide ones (:data:`FLEET_WIDE`: catalog, epoch,
recovering set, liveness, owners and workers of names, worker heartbeats, extension
errors, MCP states) under ``<ns>:{fleet}``;
a plain Redis keeps ``<ns>`` for all (docs/cluster.md).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "FUNCTION_NAME_RE",
    "MAX_FUNCTION_NAME",
    "acks_key",
    "actor_name_for",
    "affinity_queue_for",
    "aggregates_key",
    "all_keys_pattern",
    "fleet_base",
    "breaker_key",
    "broker_heartbeats_key",
    "broker_queues_key",
    "brokers_key",
    "cancel_channel",
    "cancel_key",
    "catalog_epoch_key",
    "catalog_key",
    "catalog_live_key",
    "catalog_owners_key",
    "catalog_recovering_key",
    "catalog_schemas_key",
    "catalog_workers_key",
    "claim_key",
    "crashes_key",
    "concurrency_key",
    "dead_letters_key",
    "default_queue_for",
    "events_key",
    "extension_errors_key",
    "failures_key",
    "extension_for",
    "extension_switch",
    "FLEET_WIDE",
    "DEFAULT_GROUP",
    "fleet_namespace",
    "group_namespace",
    "group_of_namespace",
    "function_name",
    "function_names",
    "idempotency_key",
    "idempotency_namespace",
    "inflight_key",
    "is_extension_function",
    "lane_key",
    "lanes_active_key",
    "limits_key",
    "mcp_servers_key",
    "outcome_key",
    "queue_key",
    "queue_msgs_key",
    "quota_inflight_key",
    "quota_key",
    "quota_rate_key",
    "reply_key",
    "route_key",
    "reply_namespace",
    "sanitize_slug",
    "SLOT_INFIX",
    "slot_lock_key",
    "slot_host",
    "slot_name",
    "slot_supervisor",
    "slots_key",
    "settings_copied_key",
    "switches_key",
    "tool_identity",
    "tool_name_for",
    "worker_info_key",
    "workers_key",
]

#: OpenAI function names: ``^[a-zA-Z0-9_-]{1,64}$``.
FUNCTION_NAME_RE = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_FUNCTION_NAME = 64
_NOT_NAME = re.compile(r"[^a-zA-Z0-9_]")
_NOT_QUEUE = re.compile(r"[^a-zA-Z0-9._-]")


#: The queue group of a worker that names none (``TOOLFLEET_QUEUE_GROUP``).
DEFAULT_GROUP = "default"
#: The keys of fleet-wide state: under a cluster they share the ``{fleet}`` slot.
FLEET_WIDE = ("catalog", "catalog epoch", "catalog recovering", "catalog live",
              "catalog owners", "catalog workers", "workers", "extension errors",
              "mcp servers")  # fmt: skip
_GROUP_TAGGED = re.compile(r"^(?P<base>.*):\{(?:g\.[^{}]*|fleet)\}$")
_NOT_TAG = re.compile(r"[{}]")


def group_namespace(namespace: str, group: str, *, cluster: bool) -> str:
    """The prefix of queue group ``group``'s keys: ``<ns>:{g.<group>}`` on a cluster, else ``<ns>``.

    The hash tag puts every key of one group (queues, lanes, bodies, acks, claims,
    outcomes, cancel markers, slots, breakers, switches, quotas, its callers' reply
    lists) in one cluster slot, so each script runs in one slot. On a plain Redis the
    group changes nothing: the key names stay as they always were. Braces in ``group``
    become ``_`` (they would end the tag).

    Args:
        namespace: the deployment's namespace (``TOOLFLEET_NAMESPACE``).
        group: the queue group (``TOOLFLEET_QUEUE_GROUP``, ``deploy/k8s/queue-groups.toml``).
        cluster: whether Redis is a cluster (:func:`toolfleet.shared.connect.is_cluster_url`).
    """
    if not cluster:
        return namespace
    return f"{fleet_base(namespace)}:{{g.{_NOT_TAG.sub('_', group)}}}"


def fleet_namespace(namespace: str, *, cluster: bool = False) -> str:
    """The prefix of fleet-wide keys for a (group) namespace.

    ``<ns>:{g.<group>}`` and ``<ns>:{fleet}`` give ``<ns>:{fleet}``; so does a plain
    ``<ns>`` with ``cluster=True``; without it a plain ``<ns>`` stays (a plain Redis).
    """
    if cluster or _GROUP_TAGGED.match(namespace):
        return f"{fleet_base(namespace)}:{{fleet}}"
    return namespace


def fleet_base(namespace: str) -> str:
    """``namespace`` without a group or fleet hash tag (the deployment's namespace)."""
    found = _GROUP_TAGGED.match(namespace)
    return found.group("base") if found else namespace


def group_of_namespace(namespace: str) -> str | None:
    """The group a :func:`group_namespace` prefix names, ``None`` for a plain or fleet one."""
    found = _GROUP_TAGGED.match(namespace)
    if not found or namespace.endswith(":{fleet}"):
        return None
    return namespace[len(found.group("base")) + 4 : -1]


def sanitize_slug(slug: str) -> str:
    """Turn an extension slug or tool name into a function-name part.

    Hyphens and other characters outside ``[a-zA-Z0-9_]`` become underscores; case is kept.
    """
    return _NOT_NAME.sub("_", slug)


def function_name(slug: str, tool: str, *, hashed: bool = False) -> str:
    """The function name of tool ``tool`` in extension ``slug``: ``ext_<slug>_<tool>``.

    Hyphens (and any other character outside ``[a-zA-Z0-9_]``) become underscores;
    case is kept (``maxPoints`` → ``ext_bfcl_maxPoints``). A name longer than 64
    characters is cut and an 8-hex-digit hash of the full name appended, so it stays
    unique and deterministic.

    Args:
        slug: the extension's slug.
        tool: the tool's name inside its extension.
        hashed: append an 8-hex-digit hash of the *raw* ``slug`` and ``tool`` (cutting
            the name to fit 64 characters): the name of a tool whose plain name another
            extension's tool also maps to (``a-b``/``c`` and ``a``/``b_c`` are both
            ``ext_a_b_c``); see :func:`function_names`.
    """
    name = f"ext_{sanitize_slug(slug)}_{sanitize_slug(tool)}"
    if hashed:
        digest = hashlib.sha256(f"{slug}\0{tool}".encode()).hexdigest()[:8]
        return f"{name[: MAX_FUNCTION_NAME - 9]}_{digest}"
    if len(name) <= MAX_FUNCTION_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: MAX_FUNCTION_NAME - 9]}_{digest}"


def function_names(tools: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Function names for a set of ``(slug, tool)`` pairs, distinct even when plain names clash.

    Every pair whose plain :func:`function_name` is shared with a different pair gets
    its hashed name (all of them, not only the later ones, so the result does not
    depend on load order); the others keep their plain name.

    Args:
        tools: ``(slug, tool)`` pairs; repeats of one pair count once.

    Returns:
        ``{(slug, tool): function name}``.
    """
    by_plain: dict[str, set[tuple[str, str]]] = {}
    for pair in tools:
        by_plain.setdefault(function_name(*pair), set()).add(pair)
    names: dict[tuple[str, str], str] = {}
    for plain, pairs in by_plain.items():
        for pair in pairs:
            names[pair] = plain if len(pairs) == 1 else function_name(*pair, hashed=True)
    return names


def tool_identity(slug: str, tool: str) -> str:
    """Which tool a function name stands for fleet-wide: ``<slug>/<tool>``.

    Unambiguous: a slug never holds ``/`` (``^[a-zA-Z0-9][a-zA-Z0-9_-]{0,39}$``).
    """
    return f"{slug}/{tool}"


def default_queue_for(slug: str) -> str:
    """The queue an extension's calls go to unless its manifest names one: ``tools.<slug>``."""
    return "tools." + _NOT_QUEUE.sub("_", slug)


#: What stands between a queue's name and a slot's in :func:`affinity_queue_for`.
SLOT_INFIX = ".slot."


def affinity_queue_for(queue: str, slot: str) -> str:
    """The queue only worker slot ``slot`` consumes, for calls with session affinity.

    ``<queue>.slot.<slot>`` with characters outside Dramatiq's queue names replaced, e.g.
    ``tools.python.slot.host-1234-0``. A slot is one supervised process place (host,
    supervisor, index): a process that dies is replaced in the same slot and serves
    the same queue.
    """
    return f"{queue}{SLOT_INFIX}{_NOT_QUEUE.sub('_', slot)}"


def slot_name(host: str, supervisor_pid: int, index: int) -> str:
    """A worker slot: ``<host>-<supervisor pid>-<index>`` (see :func:`affinity_queue_for`)."""
    return f"{host}-{supervisor_pid}-{index}"


def slot_supervisor(slot_queue: str, queue: str) -> tuple[str, int] | None:
    """The host (as its slot queue spells it) and supervisor pid of ``queue``'s slot queue.

    Args:
        slot_queue: a name :func:`affinity_queue_for` made for ``queue``.
        queue: the queue it stands in for.

    Returns:
        ``(host, pid)``, with the host's characters outside queue names replaced as
        :func:`affinity_queue_for` does (compare with :func:`slot_host`), or ``None``
        for a name of another shape.
    """
    prefix = f"{queue}{SLOT_INFIX}"
    if not slot_queue.startswith(prefix):
        return None
    host, _, rest = slot_queue[len(prefix) :].rpartition("-")
    host, _, pid = host.rpartition("-")
    if not host or not pid.isdigit() or not rest.isdigit():
        return None
    return host, int(pid)


def slot_host(host: str) -> str:
    """``host`` as slot queue names spell it (:func:`slot_supervisor`)."""
    return _NOT_QUEUE.sub("_", host)


def actor_name_for(queue: str) -> str:
    """The Dramatiq actor that serves ``queue`` (one generic actor per queue).

    ``toolfleet_call__<queue>``, the queue name unchanged: two queues never share an
    actor (``tools.a-b`` and ``tools.a_b`` would both become ``tools_a_b`` if the name
    were sanitised, and Dramatiq keeps one actor per name). Actor names may hold any
    text; queue names are Dramatiq's (letters, digits, ``.``, ``_``, ``-``), which
    Dramatiq checks when the actor is declared.
    """
    return "toolfleet_call__" + queue


def reply_key(namespace: str, client_id: str) -> str:
    """The reply list of one producer client."""
    return f"{namespace}:reply:{client_id}"


def reply_namespace(reply_list: str) -> str:
    """The key prefix a :func:`reply_key` was made with (a call's group's, on a cluster)."""
    return reply_list.rpartition(":reply:")[0]


def catalog_key(namespace: str) -> str:
    """The hash of catalog entries, one field per function name."""
    return f"{fleet_namespace(namespace)}:catalog"


def catalog_epoch_key(namespace: str) -> str:
    """The catalog's epoch id, set (NX) by the first worker that publishes into an empty Redis."""
    return f"{fleet_namespace(namespace)}:catalog:epoch"


def catalog_recovering_key(namespace: str) -> str:
    """The set of functions served before Redis lost its data, for one worker TTL after."""
    return f"{fleet_namespace(namespace)}:catalog:recovering"


def catalog_live_key(namespace: str) -> str:
    """The sorted set of catalogued names -> newest heartbeat of a worker serving each (epoch s)."""
    return f"{fleet_namespace(namespace)}:catalog:live"


def catalog_owners_key(namespace: str) -> str:
    """The hash of catalogued names -> the tool each stands for, ``<slug>/<tool>``."""
    return f"{fleet_namespace(namespace)}:catalog:owners"


def catalog_workers_key(namespace: str, function: str) -> str:
    """The sorted set of workers serving ``function`` (score: last heartbeat, epoch s)."""
    return f"{fleet_namespace(namespace)}:catalog:workers:{function}"


def catalog_schemas_key(namespace: str, function: str) -> str:
    """The sorted set of ``<schema hash> <worker id>`` serving ``function`` (score: beat).

    Which schemas of a name the live workers serve; scores are last heartbeats, epoch s.
    """
    return f"{fleet_namespace(namespace)}:catalog:schemas:{function}"


def workers_key(namespace: str, queue: str) -> str:
    """The sorted set of live workers serving ``queue`` (score: last heartbeat, epoch s)."""
    return f"{fleet_namespace(namespace)}:workers:{queue}"


def worker_info_key(namespace: str) -> str:
    """The hash of worker processes' last heartbeats: worker id -> ``WorkerInfo`` JSON."""
    return f"{namespace}:worker_info"


def queue_msgs_key(namespace: str, queue: str) -> str:
    """Dramatiq's hash of a queue's messages (pending, prefetched and running)."""
    return f"{namespace}:{queue}.msgs"


def extension_switch(slug: str) -> str:
    """The switch that turns a whole extension off: ``ext_<slug>``."""
    return f"ext_{sanitize_slug(slug)}"


def switches_key(namespace: str) -> str:
    """The hash of switch states: switch name -> ``on`` | ``off``."""
    return f"{namespace}:switches"


def settings_copied_key(namespace: str) -> str:
    """A queue group's marker that its copy of switches and quotas is written (a cluster).

    Set with the copy (:func:`toolfleet.shared.group_copies.copy_to_group`), never expired:
    when the group's master loses its data the marker goes with the copy, and the group's
    workers write the copy again (:func:`toolfleet.shared.group_copies.restore_group_copy`).
    """
    return f"{namespace}:settings_copied"


def extension_errors_key(namespace: str) -> str:
    """The hash of extension load problems: source -> message (written by workers)."""
    return f"{fleet_namespace(namespace)}:extension_errors"


def is_extension_function(name: str) -> bool:
    """True when ``name`` has the shape of an extension function, ``ext_<slug>_<tool>``."""
    return name.startswith("ext_") and name.count("_") >= 2 and bool(FUNCTION_NAME_RE.match(name))


def extension_for(name: str, known: Iterable[str] | Mapping[str, Mapping[str, Any]]) -> str | None:
    """The slug of the extension function ``name`` belongs to, or ``None``.

    Args:
        name: a function name.
        known: the catalog (function name -> entry with ``slug``, as
            ``Catalog.entries`` holds it), or the known slugs. Function names alone are
            ambiguous (``ext_a_b_c`` may be slug ``a`` or ``a-b``) and a hashed name
            (a collision, see :func:`function_names`) cannot be read back, so the catalog
            answers exactly; with slugs only, the longest matching slug wins.
    """
    if isinstance(known, Mapping):
        entry = known.get(name)
        if isinstance(entry, Mapping) and isinstance(entry.get("slug"), str):
            return str(entry["slug"])
        slugs: Iterable[str] = {
            str(e["slug"]) for e in known.values() if isinstance(e, Mapping) and "slug" in e
        }
    else:
        slugs = known
    matches = [s for s in slugs if name.startswith(f"ext_{sanitize_slug(s)}_")]
    return max(matches, key=len) if matches else None


def tool_name_for(name: str, known: Iterable[str] | Mapping[str, Mapping[str, Any]]) -> str | None:
    """The name of the tool inside its extension that function ``name`` calls, or ``None``.

    Args:
        name: a function name.
        known: the catalog (function name -> entry with ``tool``: the tool's own name,
            exact even for hashed names), or the known slugs (then the rest of the name
            after ``ext_<slug>_``, hyphens already underscores).
    """
    if isinstance(known, Mapping):
        entry = known.get(name)
        if isinstance(entry, Mapping) and isinstance(entry.get("tool"), str):
            return str(entry["tool"])
    slug = extension_for(name, known)
    if slug is None:
        return None
    return name[len(f"ext_{sanitize_slug(slug)}_") :]


def claim_key(namespace: str, call_id: str) -> str:
    """Which worker took call ``call_id`` (set before it runs)."""
    return f"{namespace}:claim:{call_id}"


def outcome_key(namespace: str, call_id: str) -> str:
    """The terminal result of call ``call_id`` (re-posted to a redelivered message)."""
    return f"{namespace}:outcome:{call_id}"


def crashes_key(namespace: str, call_id: str) -> str:
    """How many times call ``call_id``'s worker process died running it (until its deadline)."""
    return f"{namespace}:crashes:{call_id}"


def cancel_key(namespace: str, call_id: str) -> str:
    """Set when call ``call_id`` is canceled (a queued call then never runs)."""
    return f"{namespace}:cancel:{call_id}"


def cancel_channel(namespace: str) -> str:
    """Pub/sub channel on which cancellations of running calls are announced."""
    return f"{namespace}:cancel"


def brokers_key(namespace: str) -> str:
    """Hash: worker id -> its Dramatiq broker id (to requeue a dead worker's messages)."""
    return f"{namespace}:brokers"


def slots_key(namespace: str) -> str:
    """The hash of session-affinity slot queues: slot queue -> the queue it stands in for."""
    return f"{namespace}:slots"


def events_key(namespace: str) -> str:
    """The capped Redis stream of lifecycle events (``tool_requested``, ``tool_responded``)."""
    return f"{namespace}:events"


def failures_key(namespace: str) -> str:
    """The failures index: a sorted set of failed calls, scored by when they were answered.

    Layout and bounds: :mod:`toolfleet.shared.failures`.
    """
    return f"{namespace}:failures"


def mcp_servers_key(namespace: str) -> str:
    """Hash: worker id -> ``{"at": epoch s, "servers": {slug: state}}`` of its MCP sessions."""
    return f"{fleet_namespace(namespace)}:mcp_servers"


def inflight_key(namespace: str, worker_id: str) -> str:
    """Hash of the calls running in worker process ``worker_id`` (call id -> record)."""
    return f"{namespace}:inflight:{worker_id}"


# -- Dramatiq's own keys (its Redis broker's layout, which toolfleet reads and writes) ------


def queue_key(namespace: str, queue: str) -> str:
    """Dramatiq's list of the message ids waiting on ``queue``."""
    return f"{namespace}:{queue}"


def dead_letters_key(namespace: str, queue: str) -> str:
    """Dramatiq's sorted set of ``queue``'s dead-lettered message ids (its ``.XQ``)."""
    return f"{namespace}:{queue}.XQ"


def broker_heartbeats_key(namespace: str) -> str:
    """Dramatiq's sorted set of broker ids by their last heartbeat (epoch milliseconds)."""
    return f"{namespace}:__heartbeats__"


def broker_queues_key(namespace: str) -> str:
    """Hash: Dramatiq broker id -> the queues it consumes, a JSON list of names.

    Written by each worker process before it consumes (and again every heartbeat), deleted
    with the broker's heartbeat by :func:`toolfleet.worker.messaging.maintenance.run_maintenance`:
    it names every acks set (:func:`acks_key`) a dead broker can have left, so
    maintenance finds them without ``KEYS``. Named like Dramatiq's ``__heartbeats__``, so
    no queue's key can be the same.
    """
    return f"{namespace}:__broker_queues__"


def acks_key(namespace: str, broker_id: str, queue: str) -> str:
    """Dramatiq's set of the ids broker ``broker_id`` fetched from ``queue`` and not yet acked.

    With ``queue=""`` it is the prefix of every such set of that broker.
    """
    return f"{namespace}:__acks__.{broker_id}.{queue}"


def all_keys_pattern(namespace: str) -> str:
    """The ``SCAN MATCH`` pattern of every key under ``namespace``."""
    return f"{namespace}:*"


# -- session affinity and tenancy -------------------------------------------------------------


def slot_lock_key(namespace: str, slot: str) -> str:
    """The lock one worker holds while it hands back the calls of a gone ``slot``."""
    return f"{namespace}:slots:lock:{slot}"


def lane_key(namespace: str, queue: str, lane: int) -> str:
    """The Redis list of lane ``lane`` (0 to ``LANES - 1``) of ``queue``."""
    return f"{namespace}:{queue}.lane.{lane}"


def lanes_active_key(namespace: str, queue: str) -> str:
    """The rotation of ``queue``'s non-empty lanes: a list of lane numbers, each at most once.

    The fetch takes the lane at its head and puts it back at the tail while the lane
    still holds ids (:mod:`toolfleet.shared.tenancy.lanes`).
    """
    return f"{namespace}:{queue}.lanes-active"


def limits_key(namespace: str) -> str:
    """The hash of quotas: scope -> JSON quota."""
    return f"{namespace}:limits"


def quota_key(namespace: str, scope: str) -> str:
    """The usage counters of one quota scope (with ``scope=""``: the prefix of them all)."""
    return f"{namespace}:quota:{scope}"


def quota_inflight_key(namespace: str, scope: str) -> str:
    """The sorted set of one quota scope's calls in flight: call id -> deadline (epoch ms)."""
    return quota_key(namespace, f"inflight:{scope}")


def quota_rate_key(namespace: str, scope: str) -> str:
    """The rate counter of one quota scope: its theoretical arrival time (epoch ms)."""
    return quota_key(namespace, f"rate:{scope}")


def breaker_key(namespace: str, function: str) -> str:
    """The hash holding ``function``'s breaker state."""
    return f"{namespace}:breaker:{function}"


def concurrency_key(namespace: str, function: str) -> str:
    """The sorted set of ``function``'s held slots (holder -> lease end, epoch ms)."""
    return f"{namespace}:concurrency:{function}"


def route_key(namespace: str, account: str | None, conversation: str, function: str) -> str:
    """The route of one conversation's calls to ``function`` (a tool with session affinity).

    ``<ns>:route:<digest>``, the digest a SHA-256 of ``[account, conversation, function]``
    as JSON: conversation ids are each platform's own text (any characters, up to 256),
    and the account is part of the key because they need not be unique across customers.
    """
    return f"{namespace}:route:{_digest([account, conversation, function])}"


def idempotency_key(namespace: str, account: str | None, key: str, index: int | None = None) -> str:
    """The record of the call an idempotency ``key`` of ``account`` was first used for.

    ``<ns>:idempotency:<digest>``, the digest a SHA-256 of ``[account, key, index]`` as
    JSON: ``index`` is the position of a call in a turn made under ``key`` (``None`` for
    ``submit``/``call``), so a turn's calls and a single call never share a record.
    """
    return f"{namespace}:idempotency:{_digest([account, key, index])}"


def idempotency_namespace(record: str) -> str:
    """The key prefix an :func:`idempotency_key` record was made with (a group's, on a cluster)."""
    return record.rpartition(":idempotency:")[0]


def _digest(parts: list[Any]) -> str:
    text = json.dumps(parts, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("ascii")).hexdigest()


# -- aggregates --------------------------------------------------------------------------------


def aggregates_key(namespace: str, minute_s: int) -> str:
    """The hash of one minute's call aggregates (``minute_s``: its start, epoch seconds).

    Layout of its fields: :mod:`toolfleet.shared.aggregates`.
    """
    return f"{namespace}:agg:{minute_s}"
