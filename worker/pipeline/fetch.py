"""Fetch: wait in Redis for work, then take as many messages as this process can start.

The first stage of a worker process (then :mod:`.handler`: admit, run, complete). One
:class:`QueueFetcher` thread per queue list blocks in Redis with ``BLMOVE q q LEFT LEFT``
(pop the head and push it back: the list is unchanged, and the command returns as soon as
the list is non-empty) on a connection of its own, made by the same factory as the main
client (so after a Sentinel failover it asks Sentinel, not the dead master's address).
Woken, it takes up to as many messages as there are free slots (:class:`Slots`), never
more, with ``fetch.lua`` (Dramatiq's fetch plus the queue's account lanes), and hands each
to a slot thread. Fetch is claim: the same script claims each call it takes (as
``claim.lua`` would, one script for both), except a call that must wait for a fleet-wide
per-tool slot (claimed once it holds one, so a call that never started is never answered
``crashed``), one not published under its own call id, and one whose claim waits for
replicas; the handler claims those itself. After a batch shorter than asked for (the
queue ran dry) it goes back to the wait, not to another fetch: an idle process sends one
blocking command per wait.

A :class:`DelayFetcher` per queue serves Dramatiq's delay queue (``<q>.DQ``) as
Dramatiq's worker does: it holds each delayed message until its ``eta`` and then enqueues
it on its queue and acknowledges it on the delay queue, so a plain
``actor.send_with_options(delay=...)`` still runs; between etas it waits in Redis too.

A message that does not decode or could not be handled safely is a poison message
(:meth:`~toolfleet.worker.messaging.broker.FleetRedisBroker.handle_poison`).
"""

from __future__ import annotations

import abc
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from queue import SimpleQueue
from typing import Any, Protocol

import redis
from dramatiq.common import current_millis, q_name
from dramatiq.message import Message

from toolfleet.shared.connect import is_cluster
from toolfleet.shared.naming import queue_key
from toolfleet.shared.tenancy.lanes import TOKEN
from toolfleet.shared.text import as_text
from toolfleet.worker.messaging.broker import (
    RECONNECT_BACKOFF_S,
    FleetRedisBroker,
    mismatch,
    unknown_actor,
    unusable,
)

__all__ = ["DelayFetcher", "Delivery", "FetchedClaim", "QueueFetcher", "Slots", "Waiter"]

log = logging.getLogger("toolfleet.worker.fetch")

#: Longest one blocking wait lasts, seconds (less on a connection with a shorter socket
#: time-out). A stopping process ends it at once with ``CLIENT UNBLOCK`` on a single server.
WAIT_S = 5.0
#: Longest wait on a Redis Cluster (no ``CLIENT UNBLOCK`` there), seconds.
CLUSTER_WAIT_S = 1.0
#: Most messages one fetch takes: a small batch spreads a burst (a turn of parallel calls)
#: over the worker processes instead of giving it all to the first one awake.
FETCH_BATCH = 4
#: Most delayed messages one process holds in memory until their eta.
DELAY_HELD_MAX = 1000


@dataclass(frozen=True, slots=True)
class Delivery:
    """One fetched message, for a slot thread.

    Attributes:
        queue: the Dramatiq queue it came from (its acks set and ``.msgs`` hash).
        counted_as: the queue it is answered and counted as (the public queue of a
            private affinity queue).
        redis_id: the id its body is stored under.
        message: the decoded Dramatiq message.
    """

    queue: str
    counted_as: str
    redis_id: str
    message: Message[Any]
    claim: FetchedClaim | None = None


@dataclass(frozen=True, slots=True)
class FetchedClaim:
    """What the fetch script found or did for a call's claim (see ``fetch.lua``).

    Attributes:
        state: -1 not claimed by the fetch, 0 an outcome exists, 1 claimed, 2 claimed already.
        value: the outcome (0), this delivery's token (1) or the owner's token (2).
        cancel: the call's cancel marker (``b""``: not canceled).
        switches: the switch states read with the batch.
    """

    state: int
    value: bytes
    cancel: bytes
    switches: dict[Any, Any]


class ClaimSource(Protocol):
    """What a fetch that claims needs (the process's :class:`~.handler.CallHandler`)."""

    def fetch_claims(self, expected: list[str]) -> tuple[list[str], list[Any], list[str]] | None:
        """``fetch.lua``'s claim keys and arguments for ``expected`` ids (None: claim nothing)."""

    def drop_claim(self, call_id: str) -> None:
        """Give up the claim of a fetched call that will not be handled."""


class Slots:
    """The process's free slots: a fetch takes at most as many messages as are free."""

    def __init__(self, count: int) -> None:
        self._free = count
        self._cond = threading.Condition()
        self._waiting = 0

    def wait_free(self, stop: threading.Event, timeout_s: float = 1.0) -> bool:
        """Block until a slot is free (True) or ``timeout_s`` passed or ``stop`` is set."""
        with self._cond:
            if self._free <= 0 and not stop.is_set():
                self._waiting += 1
                try:
                    self._cond.wait(timeout_s)
                finally:
                    self._waiting -= 1
            return self._free > 0 and not stop.is_set()

    def take(self, most: int) -> int:
        """Take up to ``most`` free slots now; how many were taken (maybe 0)."""
        with self._cond:
            taken = min(most, self._free)
            self._free -= taken
            return taken

    def give(self, count: int = 1) -> None:
        """Give ``count`` slots back."""
        if count:
            with self._cond:
                self._free += count
                if self._waiting:  # a fetcher waits for a free slot
                    self._cond.notify_all()

    def wake(self) -> None:
        """Wake every :meth:`wait_free` (the process is stopping)."""
        with self._cond:
            self._cond.notify_all()


class Waiter:
    """A blocking wait for a list to be non-empty, on a connection of its own.

    Args:
        connect: makes a client (the process's factory, so Sentinel is asked anew).
    """

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._client: Any = None
        self._client_id: int | None = None
        self._closed = False
        self.wait_s = WAIT_S
        #: the list's head the last wait saw (None: it timed out)
        self.head: str | None = None

    def _ready(self) -> Any:
        if self._client is not None:
            return self._client
        made = self._connect()
        if is_cluster(made):
            self._client, self.wait_s = made, CLUSTER_WAIT_S
            return made
        client: Any = redis.Redis(
            connection_pool=made.connection_pool, single_connection_client=True
        )
        connection: Any = client.connection
        timeout = connection.socket_timeout
        if timeout:  # the wait must end before the socket gives up on it
            self.wait_s = max(0.1, min(WAIT_S, float(timeout) - 0.5))
        connection.register_connect_callback(self._on_connect)
        self._client = client
        self._client_id = int(client.client_id())
        return client

    def _on_connect(self, connection: Any) -> None:
        """After the wait's connection reconnected: learn its new ``CLIENT ID``."""
        self._client_id = None
        connection.send_command("CLIENT", "ID")
        self._client_id = int(connection.read_response())

    def wait(self, key: str, timeout_s: float | None = None) -> bool:
        """Block until list ``key`` is non-empty (True) or the wait timed out (False).

        Raises:
            redis.RedisError: Redis failed.
        """
        if self._closed:
            return False
        client = self._ready()
        if self._client_id is not None or not is_cluster(client):
            # (re)connect as the pool does: redis-py reconnects a dropped single connection
            # to its last address, whereas a Sentinel pool's connection asks Sentinel here
            client.connection.connect()
        timeout: Any = self.wait_s if timeout_s is None else max(0.01, min(timeout_s, self.wait_s))
        moved = client.blmove(key, key, timeout, "LEFT", "LEFT")
        self.head = None if moved is None else as_text(moved)
        return moved is not None

    def unblock(self, client: Any) -> None:
        """End a wait now (best effort; from another thread, through ``client``)."""
        self._closed = True
        waiter_id = self._client_id
        if waiter_id is None:
            return
        try:
            client.client_unblock(waiter_id)
        except redis.RedisError as exc:
            log.debug("could not end a wait: %s", exc)

    def close(self) -> None:
        """Close the wait's connection."""
        self._closed = True
        if self._client is not None and not is_cluster(self._client):
            self._client.close()
        self._client = None


class _Fetcher(abc.ABC):
    """What both fetchers share: a thread, a waiter, a backoff."""

    name = "fetch"

    def __init__(self, broker: FleetRedisBroker, queue: str, connect: Callable[[], Any]) -> None:
        self.broker = broker
        self.queue = queue
        self.key = queue_key(broker.namespace, queue)
        self.waiter = Waiter(connect)
        self.stop_event = threading.Event()
        self._failures = 0
        self.thread = threading.Thread(
            target=self._run, name=f"toolfleet-{self.name}-{queue}", daemon=True
        )

    def start(self) -> None:
        """Start the thread."""
        self.thread.start()

    def stop(self) -> None:
        """Stop fetching and end the current wait."""
        self.stop_event.set()
        self.waiter.unblock(self.broker.client)

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` for the thread, then close the wait's connection."""
        self.thread.join(timeout_s)
        self.waiter.close()

    def _run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self._step()
                self._failures = 0
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._backoff(exc)
            except Exception:  # noqa: BLE001 - the fetcher outlives any one failure
                log.exception("fetcher of %s failed; going on", self.queue)
                self.stop_event.wait(1.0)

    @abc.abstractmethod
    def _step(self) -> None:
        """One wait or one fetch (raises what Redis raised)."""

    def _backoff(self, exc: Exception) -> None:
        if self._failures == 0:
            log.warning("Redis unreachable from fetcher of %s: %s; retrying", self.queue, exc)
        self.stop_event.wait(RECONNECT_BACKOFF_S[min(self._failures, len(RECONNECT_BACKOFF_S) - 1)])
        self._failures += 1


class QueueFetcher(_Fetcher):
    """Fetches a normal queue for the process's slot threads (see the module's text).

    Args:
        broker: the process's broker.
        queue: the queue list (a public queue, or a private affinity queue).
        counted_as: the queue its calls are answered and counted as.
        slots: the process's free slots.
        inbox: where fetched deliveries go (the slot threads take them).
        actor_names: the Dramatiq actor names of this process's queues.
        connect: makes the wait's client.
        claims: the claims of a fetch (``None``: the fetch claims nothing).
    """

    def __init__(
        self,
        broker: FleetRedisBroker,
        queue: str,
        counted_as: str,
        slots: Slots,
        inbox: SimpleQueue[Delivery | None],
        actor_names: frozenset[str],
        connect: Callable[[], Any],
        claims: ClaimSource | None = None,
    ) -> None:
        super().__init__(broker, queue, connect)
        self.claims = claims
        self.counted_as = counted_as
        self.slots = slots
        self.inbox = inbox
        self.actor_names = actor_names
        self._empty = False
        #: ids the next fetch expects at the queue's head (its claim keys go in KEYS)
        self._expected: list[str] = []

    def _step(self) -> None:
        if not self.slots.wait_free(self.stop_event):
            return
        if self.broker.fetch_paused(self.queue):
            self.stop_event.wait(0.005)
            return
        if self._empty:
            # the last batch was short: wait, woken by the next push, without a fetch
            self._empty = not self.waiter.wait(self.key)
            if self._empty:
                return
            head = self.waiter.head
            self._expected = [] if head is None or head == TOKEN else [head]
        taken = self.slots.take(FETCH_BATCH)
        if not taken:
            return
        handed = 0
        try:
            claims = None if self.claims is None else self.claims.fetch_claims(self._expected)
            if claims is None:
                fetched = self.broker.fetch_with_ids(self.queue, taken)
                self._empty = len(fetched) < taken
                for redis_id, data in fetched:
                    delivery = self._decoded(redis_id, data)
                    if delivery is not None:
                        self.inbox.put(delivery)
                        handed += 1
                return
            expected, self._expected = self._expected, []
            switches, ahead, found = self.broker.fetch_claiming(
                self.queue, taken, claims, expected, FETCH_BATCH
            )
            self._expected = ahead
            self._empty = len(found) < taken
            for redis_id, data, state, value, cancel in found:
                delivery = self._decoded(redis_id, data)
                if delivery is None and state == 1 and self.claims is not None:
                    self.claims.drop_claim(redis_id)  # claimed, then found unusable
                if delivery is not None:
                    claim = FetchedClaim(state, value, cancel, switches)
                    self.inbox.put(replace(delivery, claim=claim))
                    handed += 1
        finally:
            self.slots.give(taken - handed)

    def _decoded(self, redis_id: str, data: bytes | None) -> Delivery | None:
        """The delivery of a fetched body, or None (a gone body, or a poison message)."""
        if data is None:  # its body is gone: drop the id too
            self.broker.forget_fetched(self.queue, redis_id)
            return None
        try:
            message = Message.decode(data)
            problem = (
                unusable(message, self.queue)
                or mismatch(message, redis_id)
                or unknown_actor(message, self.actor_names)
            )
            if problem:
                raise ValueError(f"unusable message: {problem}")
        except Exception as exc:  # noqa: BLE001 - a poison message, not a crash
            self.broker.handle_poison(self.queue, data, exc, redis_id)
            return None
        return Delivery(self.queue, self.counted_as, redis_id, message)


class DelayFetcher(_Fetcher):
    """Serves Dramatiq's delay queue of ``queue`` as Dramatiq's worker does.

    Fetched delayed messages are held in memory (at most :data:`DELAY_HELD_MAX`) until
    their ``eta`` (epoch milliseconds), then enqueued on ``queue`` and acknowledged on the
    delay queue; on :meth:`stop` the ones still held go back to the delay queue.
    """

    name = "delay"

    def __init__(self, broker: FleetRedisBroker, queue: str, connect: Callable[[], Any]) -> None:
        self.delay_queue = f"{queue}.DQ"
        super().__init__(broker, self.delay_queue, connect)
        self._held: list[tuple[int, int, str, Message[Any]]] = []
        self._order = itertools.count()
        self._empty = False

    def _step(self) -> None:
        self._release_due()
        if self._held and len(self._held) >= DELAY_HELD_MAX:
            self.stop_event.wait(max(0.0, self._held[0][0] / 1000 - time.time()))
            return
        next_eta_s = self._held[0][0] / 1000 - time.time() if self._held else None
        if self._empty:
            self._empty = not self.waiter.wait(self.key, next_eta_s)
            if self._empty:
                return
        room = min(DELAY_HELD_MAX - len(self._held), 100)
        fetched = self.broker.fetch_with_ids(self.delay_queue, room)
        self._empty = len(fetched) < room
        for redis_id, data in fetched:
            if data is None:
                self.broker.forget_fetched(self.delay_queue, redis_id)
                continue
            try:
                message = Message.decode(data)
                problem = unusable(message, self.delay_queue) or mismatch(message, redis_id)
                if problem:
                    raise ValueError(f"unusable message: {problem}")
            except Exception as exc:  # noqa: BLE001 - a poison message, not a crash
                self.broker.handle_poison(self.delay_queue, data, exc, redis_id)
                continue
            eta = message.options.get("eta")
            if not isinstance(eta, int | float) or isinstance(eta, bool):
                eta = current_millis()  # as Dramatiq's worker does
            heapq.heappush(self._held, (int(eta), next(self._order), redis_id, message))
        self._release_due()

    def _release_due(self) -> None:
        now = current_millis()
        while self._held and self._held[0][0] <= now:
            _, _, redis_id, message = self._held[0]
            ready = message.copy(queue_name=q_name(message.queue_name))
            ready.options.pop("eta", None)
            self.broker.enqueue(ready)
            heapq.heappop(self._held)
            self.broker.settle(self.delay_queue, redis_id)

    def join(self, timeout_s: float) -> None:
        """Wait for the thread, then give the delayed messages still held back."""
        super().join(timeout_s)
        ids = [redis_id for _, _, redis_id, _ in self._held]
        self._held = []
        if ids:
            try:
                self.broker.do_requeue(self.delay_queue, *ids)
            except redis.RedisError as exc:
                log.warning("could not requeue %d delayed messages: %s", len(ids), exc)
