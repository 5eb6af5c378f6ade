"""Read the catalog workers publish: which functions exist, their queue, and liveness.

One read is two round trips: ``HGETALL`` of the catalog with the newest heartbeat of each
name (``ZRANGE`` of ``<ns>:catalog:live``: a name no live worker serves is left out,
:func:`toolfleet.shared.catalog_life.listed`), then one pipeline with the switches and,
per queue, its live workers (``ZCOUNT`` of heartbeats within the TTL) and its length
(``HLEN`` of Dramatiq's ``<queue>.msgs``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
from pydantic import ValidationError

from toolfleet.producer._core.keyspace import KeySpace
from toolfleet.producer._redis import DeadlinePassed
from toolfleet.shared import codec
from toolfleet.shared.catalog import (
    CatalogEntry,
    Refusal,
    refusal,
    switch_states,
    switched_off,
)
from toolfleet.shared.catalog_epoch import recovering_functions
from toolfleet.shared.catalog_life import beats_of, listed
from toolfleet.shared.connect import address_of
from toolfleet.shared.naming import (
    catalog_key,
    catalog_live_key,
    catalog_recovering_key,
    queue_msgs_key,
    switches_key,
    workers_key,
)
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.text import as_text

__all__ = ["AsyncCatalogReader", "Catalog", "CatalogReader", "read_entries"]


#: Most (function, account) pairs a snapshot remembers the refusal of.
MEMO_SIZE = 4096


@dataclass(frozen=True)
class Catalog:
    """A snapshot of the catalog.

    Attributes:
        entries: function name -> catalog entry as published (the JSON object the
            exports read: name, description, parameters, queue, timeout_s, slug, ...).
        live_queues: queues with at least one worker heartbeat within the TTL.
        read_at: ``time.monotonic()`` of the read.
        switches: switch name -> on, for the switches the hash holds a state for.
        queue_lengths: queue -> messages it held at the read (queued, prefetched or
            running: ``HLEN`` of its ``.msgs`` hash).
        typed: function name -> :class:`~toolfleet.shared.catalog.CatalogEntry`, for
            every entry of ``entries`` that validates (the others are never callable).
        recovering: while Redis's catalog is being republished after it lost its data,
            the functions the fleet served before; ``None`` otherwise
            (:mod:`toolfleet.shared.catalog_epoch`).
        seen: the functions this process has seen in the catalog of this namespace.
    """

    entries: dict[str, dict[str, Any]]
    live_queues: frozenset[str]
    read_at: float
    switches: dict[str, bool] = field(default_factory=dict)
    queue_lengths: dict[str, int] = field(default_factory=dict)
    typed: dict[str, CatalogEntry] = field(default_factory=dict)
    recovering: frozenset[str] | None = None
    seen: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not self.typed and self.entries:
            object.__setattr__(self, "typed", _typed(self.entries))
        # what this snapshot says (it never changes), asked per call: function -> switched
        # off; (function, account) -> refusal; function -> identity
        object.__setattr__(self, "_off", {})
        object.__setattr__(self, "_refusals", {})
        object.__setattr__(self, "_identities", {})

    def is_live(self, function: str) -> bool:
        """True when ``function``'s queue has a live worker."""
        entry = self.typed.get(function)
        return entry is not None and entry.queue in self.live_queues

    def switched_off(self, function: str) -> bool:
        """True when a switch governing ``function`` is off (unset ones at their default)."""
        off: dict[str, bool] = self._off  # type: ignore[attr-defined]
        known = off.get(function)
        if known is None:
            entry = self.typed.get(function)
            known = off[function] = entry is not None and switched_off(entry, self.switches)
        return known

    def without_breaker(self, functions: Iterable[str]) -> frozenset[str]:
        """Those of ``functions`` whose entry declares no breaker (``"breaker": null``).

        A worker writes breaker state only for a tool whose manifest declares a breaker,
        and its catalog entry says so; an entry without the field (an older worker) may
        have one. The enqueue script skips the breaker read of these functions.
        """
        return frozenset(
            f for f in functions if f in self.entries and self.entries[f].get("breaker", 0) is None
        )

    def refusal(self, function: str, account: str | None) -> Refusal | None:
        """Why ``function`` may not be offered or called for ``account`` (``None``: it may).

        The rule producer and worker share: :func:`toolfleet.shared.catalog.refusal`
        (the snapshot remembers its answers for up to :data:`MEMO_SIZE` pairs).
        """
        memo: dict[tuple[str, str | None], Refusal | None] = self._refusals  # type: ignore[attr-defined]
        key = (function, account)
        if key in memo:
            return memo[key]
        found = self._refusal(function, account)
        if len(memo) < MEMO_SIZE:
            memo[key] = found
        return found

    def identity_of(self, function: str) -> str | None:
        """The identity (``<slug>/<tool>``) of ``function``'s entry; ``None`` without one."""
        memo: dict[str, str | None] = self._identities  # type: ignore[attr-defined]
        if function not in memo:
            entry = self.typed.get(function)
            memo[function] = entry.identity if entry is not None else None
        return memo[function]

    def _refusal(self, function: str, account: str | None) -> Refusal | None:
        entry = self.typed.get(function)
        republishing = self.recovering is not None and (
            function in self.recovering or function in self.seen
        )
        live = self.is_live(function)
        return refusal(
            function,
            entry,
            self.switches,
            account,
            live=live,
            republishing=republishing,
            known=self.typed,
        )


class CatalogReader:
    """Caches the catalog for ``cache_s`` seconds; re-reads early on a miss.

    Set :attr:`watch` to a callable listing more queues whose liveness and length each
    read also fetches (the session-affinity routes, :mod:`toolfleet.producer.affinity`).

    A function the cached snapshot shows switched off is always read again before a
    call is refused, so a switch turned on is seen by the next call.

    Args:
        client: Redis client.
        namespace: key prefix.
        cache_s: seconds a snapshot is trusted.
        worker_ttl_s: a heartbeat older than this does not count as live.
    """

    #: a miss (unknown or not live) re-reads when the snapshot is older than this
    MISS_REFRESH_S = 0.1

    def __init__(
        self,
        client: redis.Redis,
        namespace: str,
        cache_s: float,
        worker_ttl_s: float,
        keys: KeySpace | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.keys = keys or KeySpace(namespace, False, "")
        self.cache_s = cache_s
        self.worker_ttl_s = worker_ttl_s
        self._lock = threading.Lock()
        self._snapshot: Catalog | None = None
        self._seen = _seen_in(client, namespace)
        self.watch: Callable[[], Iterable[str]] | None = None

    def forget(self) -> None:
        """Drop the cached snapshot: the next :meth:`get` reads Redis.

        Called when the client saw Redis go away: a Redis that restarted without its
        data has a catalog being republished, which a snapshot from before would hide.
        """
        self._snapshot = None

    def get(self, function: str | Iterable[str] | None = None) -> Catalog:
        """A fresh-enough snapshot of the catalog.

        When a ``function`` (or any of several) is missing or not live in the cached
        one, read again (at most every ``MISS_REFRESH_S``).

        Raises:
            redis.RedisError: Redis unreachable.
        """
        snap = self.cached(function)
        if snap is not None:
            return snap
        # read outside any lock: a slow Redis must not queue every caller behind one read
        fresh = self._read()
        with self._lock:
            if self._snapshot is None or self._snapshot.read_at < fresh.read_at:
                self._snapshot = fresh
            return self._snapshot

    def cached(self, function: str | Iterable[str] | None = None) -> Catalog | None:
        """The cached snapshot when :meth:`get` would return it without reading, else ``None``.

        No I/O and no lock: what a call's thread asks first, so that a call served from
        the cache is not handed to another thread.
        """
        snap = self._snapshot
        if snap is not None and _fresh(snap, function, self.cache_s, self.MISS_REFRESH_S):
            return snap
        return None

    def _read(self) -> Catalog:
        first = pipeline(self.client)
        for command in _entry_commands(self.keys.fleet):
            getattr(first, command[0])(*command[1:])
        entries = _listed(first.execute(), self.worker_ttl_s)
        self.keys.learn(entries)
        queues = _queues(entries, self.watch)
        pipe = pipeline(self.client)
        for command in _status_commands(self.keys, queues, self.worker_ttl_s):
            getattr(pipe, command[0])(*command[1:])
        return _snapshot(entries, queues, pipe.execute(), self._seen)


class AsyncCatalogReader:
    """:class:`CatalogReader` for ``redis.asyncio``; concurrent misses share one read.

    Args:
        client: asyncio Redis client.
        namespace: key prefix.
        cache_s: seconds a snapshot is trusted.
        worker_ttl_s: a heartbeat older than this does not count as live.
        keys: the client's key prefixes (on a cluster: the fleet's slot and each group's);
            ``None``: those of ``namespace`` on a plain Redis.
    """

    MISS_REFRESH_S = CatalogReader.MISS_REFRESH_S

    def __init__(
        self,
        client: redis.asyncio.Redis,
        namespace: str,
        cache_s: float,
        worker_ttl_s: float,
        keys: KeySpace | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.keys = keys or KeySpace(namespace, False, "")
        self.cache_s = cache_s
        self.worker_ttl_s = worker_ttl_s
        self._snapshot: Catalog | None = None
        self._seen = _seen_in(client, namespace)
        self._reading: asyncio.Future[Catalog] | None = None
        self.watch: Callable[[], Iterable[str]] | None = None

    def forget(self) -> None:
        """Drop the cached snapshot: the next :meth:`get` reads Redis.

        Called when the client saw Redis go away: a Redis that restarted without its
        data has a catalog being republished, which a snapshot from before would hide.
        """
        self._snapshot = None

    async def get(
        self, function: str | Iterable[str] | None = None, *, wait_s: float | None = None
    ) -> Catalog:
        """A fresh-enough snapshot (see :meth:`CatalogReader.get`).

        Args:
            function: a function name (or several) whose miss forces an early re-read.
            wait_s: longest wait for a read, seconds (``None``: the socket timeout): what is
                left of the call's budget.

        Raises:
            DeadlinePassed: no answer within ``wait_s`` (a ``redis.TimeoutError``).
            redis.RedisError: Redis unreachable.
        """
        snap = self._snapshot
        if snap is not None and _fresh(snap, function, self.cache_s, self.MISS_REFRESH_S):
            return snap
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read())
            self._reading.add_done_callback(self._read_done)
        try:
            # shield: a caller canceled while waiting must not cancel the read others share
            async with asyncio.timeout(None if wait_s is None else max(0.0, wait_s)):
                return await asyncio.shield(self._reading)
        except TimeoutError:
            raise DeadlinePassed(f"no catalog from Redis within {wait_s:.3g} s") from None

    def _read_done(self, reading: asyncio.Future[Catalog]) -> None:
        self._reading = None
        if not reading.cancelled() and reading.exception() is None:
            fresh = reading.result()
            if self._snapshot is None or self._snapshot.read_at < fresh.read_at:
                self._snapshot = fresh

    async def _read(self) -> Catalog:
        first = pipeline(self.client)
        for command in _entry_commands(self.keys.fleet):
            getattr(first, command[0])(*command[1:])
        entries = _listed(await first.execute(), self.worker_ttl_s)
        self.keys.learn(entries)
        queues = _queues(entries, self.watch)
        pipe = pipeline(self.client)
        for command in _status_commands(self.keys, queues, self.worker_ttl_s):
            getattr(pipe, command[0])(*command[1:])
        return _snapshot(entries, queues, await pipe.execute(), self._seen)


def _fresh(
    snap: Catalog, function: str | Iterable[str] | None, cache_s: float, miss_refresh_s: float
) -> bool:
    age = time.monotonic() - snap.read_at
    if age > cache_s:
        return False
    if function is None:
        return True
    if isinstance(function, str):  # one call's function: no list
        if snap.switched_off(function):
            return False  # never refuse on a cached switch (see below)
        return age <= miss_refresh_s or snap.is_live(function)
    functions = list(function)
    if any(snap.switched_off(f) for f in functions):
        return False  # never refuse on a cached switch: `switch on` applies to the next call
    return age <= miss_refresh_s or all(snap.is_live(f) for f in functions)


def read_entries(
    client: redis.Redis, namespace: str, worker_ttl_s: float
) -> dict[str, dict[str, Any]]:
    """The catalog's entries as every reader lists them (one pipelined round trip).

    Function name -> entry (decoded JSON object), leaving out the names no live worker
    serves (:func:`toolfleet.shared.catalog_life.listed`); for ``top``, the exporter and
    the admin commands.

    Args:
        client: Redis client.
        namespace: key prefix.
        worker_ttl_s: a heartbeat older than this many seconds does not count as live.

    Raises:
        redis.RedisError: Redis unreachable.
    """
    pipe = client.pipeline(transaction=False)
    for command in _entry_commands(namespace):
        getattr(pipe, command[0])(*command[1:])
    return _listed(pipe.execute(), worker_ttl_s)


def _entry_commands(namespace: str) -> list[tuple[Any, ...]]:
    return [
        ("hgetall", catalog_key(namespace)),
        ("zrange", catalog_live_key(namespace), 0, -1, False, True),
    ]


def _listed(replies: list[Any], worker_ttl_s: float) -> dict[str, dict[str, Any]]:
    raw, beats = replies
    return listed(_entries(raw), beats_of(beats), time.time() - worker_ttl_s)


def _entries(raw: dict[Any, Any]) -> dict[str, dict[str, Any]]:
    entries: dict[str, dict[str, Any]] = {}
    for name, data in raw.items():
        try:
            entry = codec.loads(data)
        except codec.DecodeError:
            continue
        if isinstance(entry, dict):
            entries[as_text(name)] = entry
    return entries


def _typed(entries: dict[str, dict[str, Any]]) -> dict[str, CatalogEntry]:
    typed: dict[str, CatalogEntry] = {}
    for name, entry in entries.items():
        try:
            typed[name] = CatalogEntry.model_validate(entry)
        except ValidationError:
            continue
    return typed


def _queues(
    entries: dict[str, dict[str, Any]], watch: Callable[[], Iterable[str]] | None = None
) -> list[str]:
    watched = set(watch()) if watch is not None else set()
    return sorted({str(e.get("queue")) for e in entries.values()} | watched)


def _status_commands(
    keys: KeySpace, queues: list[str], worker_ttl_s: float
) -> list[tuple[Any, ...]]:
    since = time.time() - worker_ttl_s
    commands: list[tuple[Any, ...]] = [
        ("hgetall", switches_key(keys.fleet)),
        ("smembers", catalog_recovering_key(keys.fleet)),
    ]
    for queue in queues:
        commands.append(("zcount", workers_key(keys.fleet, queue), since, "+inf"))
        commands.append(("hlen", queue_msgs_key(keys.of_queue(queue), queue)))
    return commands


def _snapshot(
    entries: dict[str, dict[str, Any]], queues: list[str], replies: list[Any], seen: _Seen
) -> Catalog:
    raw_switches, recovering, *counts = replies
    live = frozenset(q for q, n in zip(queues, counts[0::2], strict=True) if n)
    lengths = {q: int(n) for q, n in zip(queues, counts[1::2], strict=True)}
    return Catalog(
        entries=entries,
        live_queues=live,
        read_at=time.monotonic(),
        switches=switch_states(raw_switches),
        queue_lengths=lengths,
        recovering=recovering_functions(recovering),
        seen=seen.add(entries),
    )


class _Seen:
    """The functions one process has seen in the catalog of one namespace (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: frozenset[str] = frozenset()

    def add(self, names: Iterable[str]) -> frozenset[str]:
        """Remember ``names`` too; every name remembered so far."""
        with self._lock:
            if not self._names.issuperset(names):
                self._names = self._names.union(names)
            return self._names


#: (Redis address, namespace) -> what this process has seen there; shared by every
#: client of the process, so that a client made after a Redis restart knows too.
_SEEN: dict[tuple[str, str], _Seen] = {}
_SEEN_LOCK = threading.Lock()


def _seen_in(client: redis.Redis | redis.asyncio.Redis, namespace: str) -> _Seen:
    key = (address_of(client), namespace)
    with _SEEN_LOCK:
        return _SEEN.setdefault(key, _Seen())
