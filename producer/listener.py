"""The reply listener: one connection and two threads for every call a client has in flight.

One thread blocks on the client's reply list and takes what it holds, up to
:data:`DRAIN_BATCH` replies, in one command (``BLMPOP``; on a Redis older than 7.0 or a
cluster, ``BLPOP`` then ``LPOP`` of the rest), and hands it to the pending-call table
(:class:`~toolfleet.producer._core.pending.PendingTable`), which resolves the futures
and routes the events. The other sleeps until the table's earliest deadline and hands
the calls due to ``expire`` (which tells the fleet, then resolves them), so no caller
waits past its deadline whatever Redis does.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
import redis.cluster

from toolfleet.producer._core.fleet import outcomes_of, queue_resolved
from toolfleet.producer._core.keyspace import KeySpace
from toolfleet.producer._core.pending import PendingTable
from toolfleet.shared.pipelines import pipeline
from toolfleet.shared.reconnect import OUTAGE_ERRORS, Reconnect

__all__ = [
    "DRAIN_BATCH",
    "MARK_WAIT_S",
    "MAX_WAIT_S",
    "ReplyListener",
    "blmpop_refused",
    "popped",
]

log = logging.getLogger("toolfleet.producer.listener")

#: Replies drained per wake-up after the blocking pop.
DRAIN_BATCH = 500
#: Longest single blocking wait, seconds (bounds how late close() is noticed).
MAX_WAIT_S = 1.0
#: Longest wait, seconds, for the fleet to take note of a call resolved here (a deadline,
#: a cancel) before its caller gets the result anyway.
MARK_WAIT_S = 0.1


def blmpop_refused(exc: redis.ResponseError, *, reraise: bool = False) -> bool:
    """Whether Redis refused ``BLMPOP`` itself (unknown before 7.0, or not the ACL user's).

    The listener then waits with ``BLPOP`` and drains with ``LPOP``. With ``reraise``,
    any other error is raised again instead of answered ``False``.
    """
    if isinstance(exc, redis.exceptions.NoPermissionError):
        return True
    if "unknown command" in str(exc).lower():
        return True
    if reraise:
        raise exc
    return False


def popped(item: Any) -> list[Any]:
    """The replies a ``BLMPOP`` answered: ``[key, [reply, ...]]``, or none at its timeout."""
    return [] if item is None else list(item[1])


class ReplyListener:
    """Feed the reply list ``key`` to ``table``; expire its calls at their deadlines.

    A call resolved here (its deadline, a cancel) gets its ``RESOLVED`` marker first
    (:mod:`toolfleet.producer._core.fleet`), written on ``commands`` by a thread of its
    own within :data:`MARK_WAIT_S`.

    Args:
        connect: makes the listener's own Redis connection (a single-connection client).
        key: the reply list.
        table: the client's pending calls.
        commands: the client's command connection.
        namespace: key prefix.
        ttl_s: seconds a marker is kept.
        keys: the client's key prefixes: on a cluster the markers are written in every
            queue group the client knows (a call's id alone does not name its group).
        deadlines: run the deadline thread (one per client: a cluster client has one
            listener per group's reply list, and only the first expires calls).
    """

    def __init__(
        self,
        connect: Callable[[], redis.Redis],
        key: str,
        table: PendingTable,
        commands: redis.Redis,
        namespace: str,
        ttl_s: int,
        keys: KeySpace | None = None,
        *,
        deadlines: bool = True,
    ) -> None:
        self._connect = connect
        self._keys = keys or KeySpace(namespace, False, "")
        self._deadlines = deadlines
        self._commands, self._namespace, self._ttl_s = commands, namespace, ttl_s
        self._marks = ThreadPoolExecutor(1, thread_name_prefix="toolfleet-marks")
        self.key = key
        self.table = table
        #: called when the listener's connection failed (the client drops its cached
        #: catalog: a Redis that restarted is republishing its own)
        self.on_outage: Callable[[], None] | None = None
        self._stop = threading.Event()
        self._moved = threading.Event()
        #: take replies with BLMPOP (until Redis says it does not know it)
        self._blmpop = True
        self._thread = threading.Thread(target=self._run, name="toolfleet-replies", daemon=True)
        self._timer = threading.Thread(
            target=self._run_deadlines, name="toolfleet-deadlines", daemon=True
        )

    def start(self) -> None:
        """Start the listener and deadline threads."""
        self._thread.start()
        if self._deadlines:
            self._timer.start()

    def rearm(self) -> None:
        """The earliest deadline moved: the deadline thread looks again."""
        self._moved.set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the threads; calls still pending resolve ``timeout`` now, none is dropped."""
        self._stop.set()
        self._moved.set()
        if self._thread.ident is not None:  # started (a forked child's may not be yet)
            self._thread.join(timeout_s)
            if self._timer.ident is not None:
                self._timer.join(timeout_s)
        self.table.close("the client was closed before a reply came")
        self._marks.shutdown(wait=False)

    def mark_within(self, call_ids: list[str]) -> list[bytes | None] | None:
        """Write the markers of ``call_ids``; their outcomes, or ``None`` if not in time."""
        try:
            return self._marks.submit(self._mark, call_ids).result(timeout=MARK_WAIT_S)
        except Exception:  # noqa: BLE001 - the fleet is told best effort; callers go on
            return None

    def mark_soon(self, call_id: str) -> None:
        """Write the marker of a call its caller canceled (in the background)."""
        with contextlib.suppress(RuntimeError):  # stopped: nobody cancels any more
            self._marks.submit(self._mark, [call_id])

    def _mark(self, call_ids: list[str]) -> list[bytes | None]:
        found: list[bytes | None] = [None] * len(call_ids)
        for prefix in self._keys.prefixes():  # one MULTI per group (one slot each)
            pipe = pipeline(self._commands, transaction=True)
            queue_resolved(pipe, prefix, call_ids, self._ttl_s)
            outcomes = outcomes_of(pipe.execute())
            found = [mine or theirs for mine, theirs in zip(found, outcomes, strict=True)]
        return found

    def _expire(self, call_ids: list[str]) -> None:
        self.table.expire(call_ids, self.mark_within(call_ids))

    def _deliver(self, batch: list[bytes]) -> None:
        self.table.deliver(batch)

    def _run(self) -> None:
        client: redis.Redis | None = None
        reconnect = Reconnect(log, "reply listener")
        while not self._stop.is_set():
            try:
                client = client or self._connect()
                if self._blmpop and not isinstance(client, redis.cluster.RedisCluster):
                    self._pop_many(client)
                    reconnect.succeeded()
                    continue
                item: Any = client.blpop([self.key], timeout=MAX_WAIT_S)
                reconnect.succeeded()
                if item is not None:
                    self._deliver([item[1]])  # resolve the first reply before draining
                    if self.table.in_flight:  # more replies due: take those already here
                        self._deliver(list(client.lpop(self.key, DRAIN_BATCH) or []))  # type: ignore[arg-type]
            except OUTAGE_ERRORS as exc:
                client = None
                if self.on_outage is not None:
                    self.on_outage()
                self._stop.wait(reconnect.failed(exc))
            except Exception:  # pragma: no cover - keep the listener alive whatever happens
                log.exception("reply listener error")
                self._stop.wait(0.1)
        if client is not None:
            client.close()

    def _pop_many(self, client: redis.Redis) -> None:
        """Wait for replies and deliver up to :data:`DRAIN_BATCH` of them (one ``BLMPOP``).

        A Redis that does not know ``BLMPOP`` (before 7.0), or an ACL user not allowed it,
        turns it off for good: the listener then takes the first reply and the rest in
        two commands.
        """
        try:
            item: Any = client.blmpop(MAX_WAIT_S, 1, self.key, direction="LEFT", count=DRAIN_BATCH)
        except redis.ResponseError as exc:
            self._blmpop = not blmpop_refused(exc, reraise=True)
            return
        self._deliver(popped(item))

    def _run_deadlines(self) -> None:
        """Hand the calls whose deadline passed to ``expire``, on time, whatever Redis does."""
        while not self._stop.is_set():
            earliest = self.table.next_deadline()
            wait_s = MAX_WAIT_S if earliest is None else earliest - time.time()
            if wait_s > 0:
                self._moved.wait(min(wait_s, MAX_WAIT_S))
                self._moved.clear()
            due = self.table.due(time.time())
            if due:
                try:
                    self._expire(due)
                except Exception:  # noqa: BLE001 - the thread outlives any failure
                    log.exception("expiring calls failed")
                    self.table.expire(due, None)
