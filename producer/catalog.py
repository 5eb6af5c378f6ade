"""Read the catalog workers publish: which functions exist, their queue, and liveness."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import redis

from toolfleet.shared import codec
from toolfleet.shared.naming import catalog_key, extension_switch, switches_key, workers_key

__all__ = ["Catalog", "CatalogReader"]


@dataclass(frozen=True)
class Catalog:
    """A snapshot of the catalog.

    Attributes:
        entries: function name -> catalog entry (name, description, parameters,
            queue, timeout_s, slug, version, tool).
        live_queues: queues with at least one worker heartbeat within the TTL.
        read_at: ``time.monotonic()`` of the read.
    """

    entries: dict[str, dict[str, Any]]
    live_queues: frozenset[str]
    read_at: float
    switches: dict[str, bool] = field(default_factory=dict)

    def is_live(self, function: str) -> bool:
        """True when ``function``'s queue has a live worker."""
        entry = self.entries.get(function)
        return entry is not None and entry.get("queue") in self.live_queues

    def refusal(self, function: str, account: str | None) -> str:
        """Why ``function`` may not be offered or called for ``account`` ("" when it may).

        Checks, in order: a live worker, enabled, switched on (the function's own switch
        and ``ext_<slug>``), and the extension's availability for the account.
        """
        entry = self.entries.get(function)
        if entry is None:
            return f"unknown function {function!r}"
        if not self.is_live(function):
            return f"no live worker serves {function!r} (queue {entry.get('queue')})"
        if entry.get("enabled") is False:
            return f"{function} is disabled"
        slug_switch = extension_switch(str(entry.get("slug", "")))
        if not (self.switches.get(function, True) and self.switches.get(slug_switch, True)):
            return f"{function} is switched off"
        availability = entry.get("availability") or {}
        allowed = availability.get("accounts_allowed")
        denied = availability.get("accounts_denied") or []
        if (account is not None and account in denied) or (
            allowed is not None and account not in allowed
        ):
            return f"{function} is not available to this account"
        return ""


class CatalogReader:
    """Caches the catalog for ``cache_s`` seconds; re-reads early on a miss.

    Args:
        client: Redis client.
        namespace: key prefix.
        cache_s: seconds a snapshot is trusted.
        worker_ttl_s: a heartbeat older than this does not count as live.
    """

    #: a miss (unknown or not live) re-reads when the snapshot is older than this
    MISS_REFRESH_S = 0.1

    def __init__(
        self, client: redis.Redis, namespace: str, cache_s: float, worker_ttl_s: float
    ) -> None:
        self.client = client
        self.namespace = namespace
        self.cache_s = cache_s
        self.worker_ttl_s = worker_ttl_s
        self._lock = threading.Lock()
        self._snapshot: Catalog | None = None

    def get(self, function: str | None = None) -> Catalog:
        """A fresh-enough snapshot of the catalog.

        When ``function`` is given and missing or not live in the cached one, read again
        (at most every ``MISS_REFRESH_S``).
        """
        snap = self._snapshot
        age = time.monotonic() - snap.read_at if snap else float("inf")
        stale = age > self.cache_s
        miss = function is not None and snap is not None and not snap.is_live(function)
        if snap is not None and not stale and not (miss and age > self.MISS_REFRESH_S):
            return snap
        # read outside any lock: a slow Redis must not queue every caller behind one read
        fresh = self._read()
        with self._lock:
            if self._snapshot is None or self._snapshot.read_at < fresh.read_at:
                self._snapshot = fresh
            return self._snapshot

    def _read(self) -> Catalog:
        raw = self.client.hgetall(catalog_key(self.namespace))
        entries: dict[str, dict[str, Any]] = {}
        for name, data in raw.items():
            try:
                entry = codec.loads(data)
            except codec.DecodeError:
                continue
            if isinstance(entry, dict):
                entries[name.decode() if isinstance(name, bytes) else str(name)] = entry
        queues = sorted({str(e.get("queue")) for e in entries.values()})
        since = time.time() - self.worker_ttl_s
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(switches_key(self.namespace))
        for queue in queues:
            pipe.zcount(workers_key(self.namespace, queue), since, "+inf")
        raw_switches, *counts = pipe.execute()
        live = frozenset(q for q, n in zip(queues, counts, strict=True) if n)
        switches = {
            (k.decode() if isinstance(k, bytes) else str(k)): v in (b"on", "on", b"1", "1")
            for k, v in raw_switches.items()
        }
        return Catalog(
            entries=entries, live_queues=live, read_at=time.monotonic(), switches=switches
        )
