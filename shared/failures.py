"""The failures index: every failed call, findable by id for a set retention (default 24 h).

The events stream is capped by count, so at a high call rate a failed call leaves it
within minutes. Failed calls (any status but ``ok``) also go to a separate index whose
depth is time: ``<ns>:failures`` (:func:`toolfleet.shared.naming.failures_key`), a sorted
set whose members are the failures' JSON records, scored by when each was answered
(epoch seconds). Each batch written trims it by time (``ZREMRANGEBYSCORE`` below
``now - retention_s``) and by count (``ZREMRANGEBYRANK``, the oldest past
``max_entries``), so its memory is bounded whatever the failure rate.

Writers never add a Redis round trip per call: a worker process buffers its failures in a
:class:`FailureLog` (O(1) per call) and its heartbeat's pipeline writes them
(:func:`write`); the watchdog writes the calls it answered once per pass; a producer
writes its refusals with its next publish or its periodic flush.

A record (:func:`record`) is ``{"id", "function", "status", "error", "account",
"worker", "at"}``, the error cut to :data:`MAX_ERROR_CHARS` and already free of secrets
(it is what the model read). Readers: :func:`newest` (one ``ZREVRANGE`` per prefix) and
:func:`search` (a ``ZSCAN`` with a pattern: a call id, a function or account name,
without regard to case; only when an operator searches).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from toolfleet.shared import codec
from toolfleet.shared.naming import failures_key

__all__ = [
    "MAX_BUFFERED",
    "MAX_ERROR_CHARS",
    "FailureLog",
    "newest",
    "record",
    "search",
    "write",
]

#: Longest error text a record keeps, characters.
MAX_ERROR_CHARS = 500
#: Most failures a process keeps while Redis is unreachable (the oldest are dropped).
MAX_BUFFERED = 10_000
#: Members ``ZSCAN`` looks at per round trip of a search.
_SCAN_COUNT = 1000


def record(
    call_id: str,
    function: str,
    status: str,
    error: str | None,
    *,
    account: str | None = None,
    worker: str = "",
    at_s: float | None = None,
) -> dict[str, Any]:
    """One failure's record (the id first, so a search by id is one pattern)."""
    return {
        "id": call_id,
        "function": function,
        "status": status,
        "error": (error or "")[:MAX_ERROR_CHARS],
        "account": account,
        "worker": worker,
        "at": time.time() if at_s is None else at_s,
    }


class FailureLog:
    """The failures one process answered since its last write, in memory.

    Thread-safe; :meth:`add` is O(1). At most :data:`MAX_BUFFERED` are kept between two
    writes (Redis unreachable for long): past that the oldest are dropped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[dict[str, Any]] = []

    def add(self, failure: dict[str, Any]) -> None:
        """Keep one failure's :func:`record` for the next write."""
        with self._lock:
            self._records.append(failure)
            if len(self._records) > MAX_BUFFERED:
                del self._records[: len(self._records) - MAX_BUFFERED]

    def drain(self) -> list[dict[str, Any]]:
        """Take every record kept (the log is empty after)."""
        with self._lock:
            taken, self._records = self._records, []
        return taken

    def restore(self, records: Sequence[dict[str, Any]]) -> None:
        """Put back what :meth:`drain` took and could not be written (Redis failed)."""
        with self._lock:
            self._records[:0] = records
            if len(self._records) > MAX_BUFFERED:
                del self._records[: len(self._records) - MAX_BUFFERED]

    def __len__(self) -> int:
        with self._lock:
            return len(self._records)


class _Pipeline(Protocol):
    def zadd(self, name: str, mapping: Any) -> Any: ...  # noqa: D102
    def zremrangebyscore(self, name: str, min: Any, max: Any) -> Any: ...  # noqa: A002, D102
    def zremrangebyrank(self, name: str, min: int, max: int) -> Any: ...  # noqa: A002, D102
    def expire(self, name: str, time: int) -> Any: ...  # noqa: D102


def write(
    pipe: _Pipeline,
    namespace: str,
    records: Iterable[dict[str, Any]],
    retention_s: int,
    max_entries: int,
    now_s: float | None = None,
) -> int:
    """Queue the commands adding ``records`` to the index on ``pipe``, then trim it.

    Four commands per batch, whatever its size: ``ZADD`` (all records), the trims by
    time and by count, and an ``EXPIRE`` of ``retention_s`` (an idle fleet's index
    goes away). Nothing is queued for an empty batch or a ``retention_s`` of 0.

    Args:
        pipe: a redis-py pipeline.
        namespace: the key prefix.
        records: :func:`record` values.
        retention_s: seconds a failure stays findable.
        max_entries: most records the index keeps.
        now_s: the time the trim counts from, epoch seconds (default: now).

    Returns:
        The number of commands queued.
    """
    mapping = {codec.dumps(r): float(r.get("at") or 0) for r in records}
    if not mapping or retention_s <= 0:
        return 0
    key = failures_key(namespace)
    now = time.time() if now_s is None else now_s
    pipe.zadd(key, mapping)
    pipe.zremrangebyscore(key, "-inf", f"({now - retention_s!r}")
    pipe.zremrangebyrank(key, 0, -(max_entries + 1))
    pipe.expire(key, retention_s)
    return 4


class _Reader(Protocol):
    def pipeline(self, transaction: bool = ...) -> Any: ...  # noqa: D102
    def zscan(self, name: str, cursor: int = ..., match: Any = ..., count: Any = ...) -> Any: ...  # noqa: D102


def _decode(raw: Any) -> dict[str, Any] | None:
    try:
        found = codec.loads(raw)
    except codec.DecodeError:
        return None
    return found if isinstance(found, dict) and "id" in found else None


def newest(client: _Reader, prefixes: Sequence[str], count: int) -> list[dict[str, Any]]:
    """The newest ``count`` failures of every prefix, newest first (one round trip)."""
    pipe = client.pipeline(transaction=False)
    for prefix in prefixes:
        pipe.zrevrange(failures_key(prefix), 0, count - 1)
    found = [r for members in pipe.execute() for r in map(_decode, members) if r is not None]
    found.sort(key=lambda r: -float(r.get("at") or 0))
    return found[:count]


def _pattern(text: str) -> str:
    """A ``ZSCAN`` glob matching ``text`` anywhere, letters in either case."""
    out = []
    for char in text:
        if char in "*?[]\\":
            out.append("\\" + char)
        elif char.lower() != char.upper():
            out.append(f"[{char.lower()}{char.upper()}]")
        else:
            out.append(char)
    return "*" + "".join(out) + "*"


def search(
    client: _Reader, prefixes: Sequence[str], text: str, limit: int = 100
) -> list[dict[str, Any]]:
    """The failures whose id, function, account (or other field) contains ``text``.

    Scans the whole index (``ZSCAN``, 1,000 members a round trip, matched in Redis):
    for an operator's search, never a page refresh. Newest first, at most ``limit``.
    A record whose ``id``, ``function`` or ``account`` holds ``text`` (any case) is kept.
    """
    needle = text.lower()
    pattern = _pattern(text)
    found: list[dict[str, Any]] = []
    for prefix in prefixes:
        cursor = 0
        while True:
            cursor, members = client.zscan(
                failures_key(prefix), cursor, match=pattern, count=_SCAN_COUNT
            )
            for member, _score in members:
                r = _decode(member)
                if r is not None and any(
                    needle in str(r.get(name) or "").lower()
                    for name in ("id", "function", "account")
                ):
                    found.append(r)
            if not cursor:
                break
    found.sort(key=lambda r: -float(r.get("at") or 0))
    return found[:limit]
