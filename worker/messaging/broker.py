"""A Redis broker whose consumers wait for work instead of sleeping on a poll interval.

Dramatiq's Redis consumer, finding its queue empty, sleeps with a growing backoff (up
to the worker timeout) before it polls again, so a call that arrives while a worker is
idle waits for the next poll. This consumer instead blocks in Redis with
``BLMOVE q q LEFT LEFT`` (pop the head and push it back: the list is unchanged, and
the command returns as soon as the list is non-empty), then fetches with Dramatiq's
fetch, which also takes from the queue's account lanes round-robin
(:mod:`toolfleet.shared.tenancy.lanes`); after a batch shorter than asked for (the queue
ran dry) it goes back to the wait, not to another fetch. A message whose call is answered is
acknowledged in the script that posts the reply (Dramatiq's ``ack`` commands, on its
keys), saving Dramatiq's own round trip. Message format, keys, acks, heartbeats and dead
letters are Dramatiq's, but Dramatiq's own maintenance (``KEYS`` inside its dispatch
script) never runs here: toolfleet's runs instead (:mod:`.maintenance`). The broker
heartbeat Dramatiq writes on every fetch is written by the process's periodic heartbeat
instead
(:class:`~toolfleet.worker.supervision.heartbeat.CatalogPublisher`, every
``heartbeat_interval_s``, well inside ``broker_heartbeat_timeout_s``), so a fetch costs
no heartbeat command. A message that does not decode is dead-lettered on its own
instead of failing the consumer (which would strand the messages fetched with it until
Dramatiq noticed the worker as dead). So is one that decodes but that Dramatiq's worker
could not handle safely (see :func:`unusable`): Dramatiq trusts the message's fields,
and a body with, say, an unhashable ``message_id`` crashes the consumer thread, a
``queue_name`` of another queue or a ``throws`` option that is not an exception class
kills the worker thread that took it, and an ``eta`` far in the future holds a prefetch
slot for good.
This relies on
``dramatiq.brokers.redis._RedisConsumer`` internals of the pinned Dramatiq version;
``tests/test_dramatiq_contract.py`` fails when they change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from dramatiq import Middleware, Worker
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.common import compute_backoff, dq_name, q_name
from dramatiq.errors import ConnectionClosed
from dramatiq.message import Message
from dramatiq.middleware import CurrentMessage, ShutdownNotifications

from toolfleet.shared import scripts
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.naming import (
    DEFAULT_GROUP,
    acks_key,
    group_namespace,
    queue_key,
    queue_msgs_key,
)
from toolfleet.shared.tenancy.lanes import TOKEN, lane_keys, lanes_active_key
from toolfleet.shared.text import as_text
from toolfleet.worker.messaging.middleware import FleetMiddleware
from toolfleet.worker.pipeline.ledger import InlineAck
from toolfleet.worker.supervision.redis_factory import redis_client

__all__ = [
    "DelayQueueConsumer",
    "FleetRedisBroker",
    "WaitingConsumer",
    "fleet_middleware",
    "hold_dispatch_through_migrations",
    "make_broker",
    "unusable",
    "wake_consumers",
]

logger = logging.getLogger("toolfleet.worker.consumer")

#: Seconds one blocking wait lasts before the consumer returns to Dramatiq's loop
#: (acks, heartbeats and shutdown are handled between waits). A stopping worker ends the
#: wait at once (:meth:`WaitingConsumer.wake`) on a single Redis server.
WAIT_S = 1.0
#: Seconds a stopping consumer pauses between its returns to Dramatiq's loop.
STOPPING_PAUSE_S = 0.01
#: Longest pause, milliseconds, between two polls of an idle delay queue (Dramatiq's
#: worker timeout by default; the worker's own is shorter, for a prompt stop).
DELAY_POLL_MS = 1000
#: Most messages one fetch takes: a small batch spreads a burst (a turn of parallel calls)
#: over the worker processes instead of giving it all to the first one awake.
FETCH_BATCH = 4
#: Longest an idle consumer goes without running Dramatiq's fetch script, seconds.
IDLE_FETCH_S = 10.0
#: Seconds to pause when the prefetch window is full (no Redis call is made).
FULL_WINDOW_PAUSE_S = 0.002
#: Seconds between attempts while Redis is unreachable (the last one repeats).
RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
#: Seconds an acknowledgement is retried here before Dramatiq's own 5-second retry loop.
ACK_RETRY_S = 10.0


class WaitingConsumer(_RedisConsumer):
    """Dramatiq's Redis consumer with a blocking wait instead of an idle poll.

    It also rides out a Redis restart or a dropped connection itself, retrying with a
    short backoff: Dramatiq's consumer thread would drop this consumer (and the messages
    it fetched) and build a new one only after 3 s, and its worker threads would retry a
    failed acknowledgement only every 5 s, so service resumed seconds after Redis did.

    On a single Redis server (not a Cluster) the blocking wait runs on a connection of
    its own, whose ``CLIENT ID`` is known (read again on every reconnect), so that
    :meth:`wake` can end it with ``CLIENT UNBLOCK`` from another thread.
    """

    def __init__(self, broker: RedisBroker, queue_name: str, prefetch: int, timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, timeout)  # type: ignore[no-untyped-call]
        self._queue_key = queue_key(broker.namespace, queue_name)
        self._failures = 0
        self._queue_empty = False
        self._fetched_at = 0.0
        self._cache_ids: list[str] = []
        self._stopping = threading.Event()
        self._waiter: redis.Redis | None = None
        self._waiter_id: int | None = None

    def _backoff(self, exc: redis.RedisError) -> None:
        """Wait before the next attempt to reach Redis (logs the first failure of a run)."""
        if self._failures == 0:
            logger.warning("Redis unreachable from consumer of %s: %s; retrying",
                           self.queue_name, exc)  # fmt: skip
        time.sleep(RECONNECT_BACKOFF_S[min(self._failures, len(RECONNECT_BACKOFF_S) - 1)])
        self._failures += 1

    def ack(self, message: MessageProxy) -> None:
        """Acknowledge, retrying for up to ``ACK_RETRY_S`` while Redis is unreachable.

        A message acknowledged already by the script that answered its call (see
        :meth:`FleetRedisBroker.inline_ack`) costs no round trip.
        """
        inline = self.broker.take_inline_ack(message)
        if inline is not None and inline.done:
            self.queued_message_ids.discard(message.message_id)
            return
        self._settle(super().ack, message)

    def nack(self, message: MessageProxy) -> None:
        """Dead-letter, retrying for up to ``ACK_RETRY_S`` while Redis is unreachable."""
        self.broker.take_inline_ack(message)
        self._settle(super().nack, message)

    def _settle(self, settle: Callable[[MessageProxy], None], message: MessageProxy) -> None:
        give_up = time.monotonic() + ACK_RETRY_S
        attempt = 0
        while True:
            try:
                settle(message)
                return
            except ConnectionClosed:
                if time.monotonic() >= give_up:
                    raise  # Dramatiq's worker thread keeps retrying every 5 s
                time.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
                attempt += 1

    def wake(self) -> None:
        """Stop handing out messages and end a blocking wait now (callable from any thread).

        The worker is stopping: its worker threads take no more messages, so the consumer
        only returns to Dramatiq's loop (which ends it) and gives its prefetched messages
        back on :meth:`close`. Ending the wait is best effort: when ``CLIENT UNBLOCK``
        fails or the server is a Cluster, the wait ends at ``WAIT_S``.
        """
        self._stopping.set()
        waiter_id = self._waiter_id
        if waiter_id is None:
            return
        try:
            self.broker.client.client_unblock(waiter_id)
        except redis.RedisError as exc:
            logger.debug("could not end the wait of consumer %s: %s", self.queue_name, exc)

    def __next__(self) -> Any:
        if self._stopping.is_set():
            time.sleep(STOPPING_PAUSE_S)
            return None
        try:
            while True:
                if self.message_cache:
                    data = self.message_cache.pop(0)
                    redis_id = self._cache_ids.pop(0) if self._cache_ids else None
                    if data is None:
                        if redis_id is not None:  # its body is gone: drop the id too
                            self.broker.forget_fetched(self.queue_name, redis_id)
                        continue
                    try:
                        message = Message.decode(data)
                        problem = (
                            unusable(message, self.queue_name)
                            or _mismatch(message, redis_id)
                            or _unknown_actor(message, self.broker)
                        )
                        if problem:
                            raise ValueError(f"unusable message: {problem}")
                    except Exception as exc:  # noqa: BLE001 - a poison message, not a crash
                        self.broker.handle_poison(self.queue_name, data, exc, redis_id)
                        continue
                    self.misses = 0
                    self.queued_message_ids.add(message.message_id)
                    return MessageProxy(message)
                if self.outstanding_message_count >= self.prefetch or (
                    isinstance(self.broker, FleetRedisBroker)
                    and self.broker.fetch_paused(self.queue_name)
                ):
                    time.sleep(FULL_WINDOW_PAUSE_S)
                    return None
                if self._queue_empty and time.monotonic() - self._fetched_at < IDLE_FETCH_S:
                    # the last fetch was short or the last wait timed out on an empty
                    # queue: wait without a fetch (heartbeats come from the catalog
                    # thread, so an idle worker costs one blocking command per WAIT_S);
                    # woken by work, fetch it now
                    self._wait()
                    if self._queue_empty:
                        return None
                    continue
                asked = min(FETCH_BATCH, self.prefetch - self.outstanding_message_count)
                fetched = self.broker.fetch_with_ids(self.queue_name, asked)
                self._fetched_at = time.monotonic()
                self._failures = 0
                # fewer than asked: the queue list ran dry, so once these are handed out
                # the consumer waits (one blocking command, woken by the next push)
                # instead of running the fetch script on an empty queue
                self._queue_empty = len(fetched) < asked
                if fetched:
                    self._cache_ids = [redis_id for redis_id, _ in fetched]
                    self.message_cache = [data for _, data in fetched]
                    continue
                self._wait()
                return None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._backoff(exc)  # keep the fetched messages; Dramatiq's loop calls again
            return None

    def _wait(self) -> None:
        """Block until the queue list is non-empty, for at most ``WAIT_S`` seconds."""
        if self._stopping.is_set():
            return
        client = self._wait_client()
        # redis-py types the timeout int; Redis takes seconds as a decimal number
        timeout: Any = WAIT_S
        moved = client.blmove(self._queue_key, self._queue_key, timeout, "LEFT", "LEFT")
        self._queue_empty = moved is None

    def _wait_client(self) -> redis.Redis:
        """The client the wait blocks on: one connection of its own, on a single server."""
        if self._waiter is not None:
            # (re)connect as the pool does: redis-py reconnects a dropped single connection
            # to its last address, whereas a Sentinel pool's connection asks Sentinel here
            self._waiter.connection.connect()  # type: ignore[union-attr]
            return self._waiter
        client = self.broker.client
        if is_cluster(client):
            return client  # type: ignore[no-any-return]
        waiter = redis.Redis(connection_pool=client.connection_pool, single_connection_client=True)
        assert waiter.connection is not None  # noqa: S101 - single_connection_client holds one
        connection = waiter.connection
        connection.register_connect_callback(self._on_waiter_connect)  # type: ignore[no-untyped-call]
        self._waiter = waiter
        self._waiter_id = int(waiter.client_id())  # later ones: _on_waiter_connect
        return waiter

    def _on_waiter_connect(self, connection: Any) -> None:
        """After the wait's connection reconnected: learn its new ``CLIENT ID``."""
        self._waiter_id = None
        connection.send_command("CLIENT", "ID")
        self._waiter_id = int(connection.read_response())

    def close(self) -> None:
        """Give messages fetched but not yet handed to a worker thread back to the queue.

        Dramatiq's consumer leaves them for its maintenance to find much later.
        """
        ids = []
        for data in self.message_cache:
            try:
                ids.append(Message.decode(data).options["redis_message_id"])
            except Exception:  # noqa: BLE001, S112 - undecodable: maintenance handles it
                continue
        self.message_cache = []
        self._cache_ids = []
        if self._waiter is not None:
            self._waiter_id = None
            self._waiter.close()  # gives its connection back to the broker's pool
            self._waiter = None
        if ids:
            try:
                self.broker.do_requeue(self.queue_name, *ids)
            except redis.RedisError as exc:
                logger.warning("could not requeue %d prefetched messages: %s", len(ids), exc)


class DelayQueueConsumer(_RedisConsumer):
    """Dramatiq's polling consumer of a delay queue (``.DQ``), whose idle pause can be ended.

    Dramatiq's consumer sleeps after a fetch that found nothing, for a backoff growing up
    to its timeout; here the backoff grows to :data:`DELAY_POLL_MS` whatever the worker
    timeout, and the pause is a wait that :meth:`wake` ends.
    """

    def __init__(self, broker: RedisBroker, queue_name: str, prefetch: int) -> None:
        # timeout 0: Dramatiq's own sleep after a miss lasts 0 s; __next__ pauses instead
        super().__init__(broker, queue_name, prefetch, 0)  # type: ignore[no-untyped-call]
        self._stopping = threading.Event()
        self._idle_polls = 0

    def wake(self) -> None:
        """Stop fetching and end the current pause (callable from any thread)."""
        self._stopping.set()

    def __next__(self) -> Any:
        if self._stopping.is_set():
            time.sleep(STOPPING_PAUSE_S)
            return None
        message = super().__next__()  # type: ignore[no-untyped-call]
        if message is None:
            self._idle_polls, backoff_ms = compute_backoff(
                self._idle_polls, max_backoff=DELAY_POLL_MS
            )
            self._stopping.wait(backoff_ms / 1000)
        else:
            self._idle_polls = 0
        return message


#: Options Dramatiq acts on that toolfleet's producer never sets (see :func:`unusable`).
_FORBIDDEN_OPTIONS = ("eta", "throws", "notify_shutdown")


def unusable(message: Message[Any], queue_name: str) -> str:
    """Why Dramatiq's worker cannot safely handle ``message`` from ``queue_name`` ("" if it can).

    Checks what Dramatiq uses without checking: string ``actor_name`` and ``message_id``,
    a ``queue_name`` equal to the queue it came from, a ``kwargs`` object, an ``options``
    object holding a string ``redis_message_id`` (to acknowledge it), and none of the
    options ``eta``, ``throws``, ``notify_shutdown`` on a normal queue (toolfleet's producer
    never sets them; Dramatiq acts on them).
    """
    if not isinstance(message.actor_name, str) or not isinstance(message.message_id, str):
        return "actor_name and message_id must be strings"
    if message.queue_name != queue_name:
        return f"queue_name {str(message.queue_name)[:80]!r} is not {queue_name!r}"
    if not isinstance(message.kwargs, dict):
        return "kwargs must be an object"
    options = message.options
    if not isinstance(options, dict) or not isinstance(options.get("redis_message_id"), str):
        return "options must be an object holding a string redis_message_id"
    if queue_name != dq_name(q_name(queue_name)):
        forbidden = [name for name in _FORBIDDEN_OPTIONS if name in options]
        if forbidden:
            return f"options {', '.join(forbidden)} are not accepted on {queue_name!r}"
    return ""


#: ``fetch.lua`` (what it takes and returns is written at its head).
_FETCH_WITH_IDS = scripts.source("fetch", TOKEN=TOKEN)


def _mismatch(message: Message[Any], redis_id: str | None) -> str:
    """Why ``message`` cannot be acknowledged by its own ``redis_message_id`` ("" if it can)."""
    stored = message.options.get("redis_message_id")
    if redis_id is None or stored == redis_id:
        return ""
    return f"redis_message_id {str(stored)[:80]!r} is not the key {redis_id!r} it is stored under"


def _unknown_actor(message: Message[Any], broker: RedisBroker) -> str:
    """Why ``broker`` has no actor for ``message`` ("" when it has one).

    Dramatiq's consumer thread dead-letters such a message before any middleware sees it,
    so it would go unanswered; as a poison message it is answered ``rejected``.
    """
    if message.actor_name in broker.actors:
        return ""
    return f"no actor {str(message.actor_name)[:80]!r} on this worker"


class FleetRedisBroker(RedisBroker):
    """Dramatiq's ``RedisBroker`` using :class:`WaitingConsumer` for normal queues.

    Attributes:
        on_poison: called with ``(queue, data, error)`` for a message that does not decode,
            after it was dead-lettered (the worker answers ``rejected`` where it can).
        poison_messages: how many such messages this broker dead-lettered.
    """

    on_poison: Callable[[str, bytes, Exception], None] | None = None
    poison_messages = 0
    _fetch_script: Any = None
    _inline_acks: dict[str, InlineAck] | None = None
    _paused: dict[str, float] | None = None

    def _should_do_maintenance(self, command: str) -> int:
        """0: Dramatiq's dispatch script never runs its own maintenance here.

        Its maintenance calls ``KEYS`` and builds its keys inside Lua (undeclared, so not
        routable on a Redis Cluster); toolfleet's workers run
        :func:`~toolfleet.worker.messaging.maintenance.run_maintenance` instead, whatever
        ``maintenance_chance`` says (:func:`make_broker` sets it to 0 as well).
        """
        return 0

    def pause_fetch(self, queue_name: str, seconds: float) -> None:
        """Let this broker's consumer of ``queue_name`` fetch nothing for ``seconds``.

        For a call this process handed back to its queue (a name it does not serve): a
        worker that serves it fetches the call meanwhile.
        """
        if self._paused is None:
            self._paused = {}
        self._paused[queue_name] = time.monotonic() + seconds

    def fetch_paused(self, queue_name: str) -> bool:
        """True while :meth:`pause_fetch` holds this broker's consumer of ``queue_name``."""
        paused = self._paused
        return paused is not None and time.monotonic() < paused.get(queue_name, 0.0)

    def inline_ack(self, message: MessageProxy | Message[Any]) -> InlineAck | None:
        """An acknowledgement of ``message`` for the script that answers its call to make.

        Dramatiq's ``ack`` (drop the id from this broker's acks set of the queue; if it was
        there, drop the body), done by :func:`~toolfleet.worker.pipeline.ledger.post_outcome`
        in the round trip that posts the reply. The consumer's :meth:`WaitingConsumer.ack`
        then skips its own round trip; when the call ends unanswered (``done`` still False)
        it acknowledges as Dramatiq does. None for a delay queue (its messages are re-enqueued,
        not answered) or a message without a string ``redis_message_id``.
        """
        redis_id = message.options.get("redis_message_id")
        queue = message.queue_name
        if not isinstance(redis_id, str) or queue == dq_name(q_name(queue)):
            return None
        ack = InlineAck(self._acks_key(queue), queue_msgs_key(self.namespace, queue), redis_id)
        if self._inline_acks is None:
            self._inline_acks = {}
        self._inline_acks[redis_id] = ack
        return ack

    def take_inline_ack(self, message: MessageProxy) -> InlineAck | None:
        """Remove and return the :meth:`inline_ack` made for ``message``, if any."""
        if not self._inline_acks:
            return None
        return self._inline_acks.pop(str(message.options.get("redis_message_id")), None)

    def fetch_with_ids(self, queue_name: str, count: int) -> list[tuple[str, bytes | None]]:
        """Fetch up to ``count`` messages as ``(redis id, body)`` pairs.

        Dramatiq's own ``fetch`` command, taking from the queue's lanes round-robin, plus
        the id each body is stored under (Dramatiq returns bodies only and acknowledges
        by the id written *inside* the body, so a body whose ``redis_message_id`` differs
        from its key would stay in ``.msgs`` for good). A body that is gone is ``None``.

        Raises:
            redis.RedisError: Redis failed.
        """
        if self._fetch_script is None:
            self._fetch_script = self.client.register_script(_FETCH_WITH_IDS)
        keys = [
            queue_key(self.namespace, queue_name),
            self._acks_key(queue_name),
            queue_msgs_key(self.namespace, queue_name),
            lanes_active_key(self.namespace, queue_name),
            *lane_keys(self.namespace, queue_name),
        ]
        flat = self._fetch_script(keys, [count])
        pairs = []
        for i in range(0, len(flat), 2):
            redis_id = as_text(flat[i])
            pairs.append((redis_id, flat[i + 1]))
        return pairs

    def forget_fetched(self, queue_name: str, redis_id: str) -> None:
        """Drop a fetched id whose body no longer exists from this broker's unacked set."""
        try:
            self.client.srem(self._acks_key(queue_name), redis_id)
        except redis.RedisError as exc:
            logger.warning("could not drop fetched id %s: %s", redis_id, exc)

    def _acks_key(self, queue_name: str) -> str:
        return acks_key(self.namespace, self.broker_id, queue_name)

    def handle_poison(
        self, queue_name: str, data: bytes, error: Exception, redis_id: str | None = None
    ) -> None:
        """Dead-letter an undecodable message this consumer fetched.

        The others fetched with it are not stranded. Its Redis id is ``redis_id`` when
        known, else it is found among this broker's unacked ids.
        """
        self.poison_messages += 1
        logger.error("undecodable message on %s dead-lettered: %s", queue_name, str(error)[:200])
        acks = self._acks_key(queue_name)
        try:
            if redis_id is not None:
                self.do_nack(queue_name, redis_id)
                ids = []
            else:
                ids = list(self.client.smembers(acks))
            if ids:
                bodies = self.client.hmget(queue_msgs_key(self.namespace, queue_name), ids)
                for message_id, body in zip(ids, bodies, strict=True):
                    if body == data:
                        self.do_nack(queue_name, message_id.decode())
                        break
        except redis.RedisError as exc:
            logger.error("could not dead-letter the message: %s", exc)
        if self.on_poison is not None:
            try:
                self.on_poison(queue_name, data, error)
            except Exception:  # noqa: BLE001 - answering is best effort; the consumer goes on
                logger.exception("could not answer the undecodable message")

    def consume(self, queue_name: str, prefetch: int = 1, timeout: int = 5000) -> Any:
        """Create a consumer; delay queues (``.DQ``) keep Dramatiq's polling consumer.

        ``timeout`` (milliseconds, the worker timeout) is not used for waits: see
        :data:`WAIT_S` and :class:`DelayQueueConsumer`.
        """
        if queue_name == dq_name(q_name(queue_name)):
            return DelayQueueConsumer(self, queue_name, prefetch)
        return WaitingConsumer(self, queue_name, prefetch, timeout)


def wake_consumers(worker: Worker) -> None:
    """End the blocking waits of ``worker``'s consumers, before ``worker.stop()``.

    Without it, each consumer thread finishes its current wait (up to ``WAIT_S``) before
    it sees it is stopping. See :meth:`WaitingConsumer.wake`.
    """
    for thread in list(worker.consumers.values()):
        consumer = thread.consumer
        if isinstance(consumer, WaitingConsumer | DelayQueueConsumer):
            consumer.wake()


def fleet_middleware(broker: FleetRedisBroker) -> FleetMiddleware:
    """The :class:`FleetMiddleware` of a broker made by :func:`make_broker`."""
    return next(m for m in broker.middleware if isinstance(m, FleetMiddleware))


def make_broker(
    url: str,
    namespace: str,
    middleware: list[Middleware] | None = None,
    *,
    factory: str | None = None,
    group: str = DEFAULT_GROUP,
) -> FleetRedisBroker:
    """A Redis broker for ``url`` (or ``factory``'s client), every key under ``namespace``.

    On a Redis Cluster, Dramatiq's namespace is the group's
    (:func:`~toolfleet.shared.naming.group_namespace`): its scripts build their keys from
    it, so they all land in the group's slot.

    Args:
        url: Redis URL.
        namespace: key prefix (``TOOLFLEET_NAMESPACE``).
        group: the queue group this worker serves.
        middleware: extra middleware added after toolfleet's own set.
        factory: ``MODULE:ATTR`` of a ``redis.Redis`` factory, used instead of ``url``
            (Dramatiq's ``RedisBroker`` takes the ready client).
    """
    stack: list[Middleware] = [FleetMiddleware(), CurrentMessage(), ShutdownNotifications()]
    client = redis_client(url, factory=factory, health_check_interval=30)
    broker = FleetRedisBroker(  # type: ignore[no-untyped-call]
        client=client,
        namespace=group_namespace(namespace, group, cluster=is_cluster(client)),
        middleware=stack + list(middleware or []),
        maintenance_chance=0,  # toolfleet runs its own (worker.messaging.maintenance)
    )
    if is_cluster(client):
        hold_dispatch_through_migrations(broker)
    return broker


#: Suffix of a key of the group's slot that is never written (see
#: :func:`hold_dispatch_through_migrations`).
NEVER_WRITTEN = ":__never_written__"


def hold_dispatch_through_migrations(broker: RedisBroker) -> None:
    """Make Dramatiq's dispatch script wait while its slot migrates, on a cluster.

    ``dispatch.lua`` (acks, nacks, requeues, heartbeats, maintenance) declares one key,
    the namespace, which never exists, and builds every key it touches from it. During a
    migration of the group's slot the source master answers a script whose declared keys
    are all missing with ``ASK``, so Dramatiq's script would run on the importing master
    while the queue, acks and heartbeats still live on the source: it would write a second
    copy of them there (the migration then fails on ``BUSYKEY``, or a ``REPLACE`` loses
    one copy). Declared with a second key of the slot that is never written, the script
    gets ``TRYAGAIN`` from either master until the migration ends (a multi-key command
    with a key missing on a slot in migration), which the cluster client retries
    (:class:`toolfleet.shared.connect.RetryingCluster`); ``dispatch.lua`` reads only
    ``KEYS[1]``.
    """
    original = broker.scripts["dispatch"]
    guard = broker.namespace + NEVER_WRITTEN

    def dispatch(keys: list[str], args: list[Any]) -> Any:
        return original(keys=[*keys, guard], args=args)

    broker.scripts["dispatch"] = dispatch
