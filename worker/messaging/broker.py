"""Dramatiq's Redis broker as toolfleet's transport: its message format, keys and scripts.

toolfleet's worker runs its own loop (:mod:`toolfleet.worker.pipeline.fetch` and
:mod:`toolfleet.worker.pipeline.loop`), not Dramatiq's ``Worker``; this broker keeps what
the loop needs of Dramatiq: the queue list, the ``.msgs`` hash, the per-broker acks sets,
the delay queue (``.DQ``), dead letters, and Dramatiq's ``dispatch`` script for
acknowledging, dead-lettering and requeueing, so a plain Dramatiq ``actor.send`` to a
toolfleet queue is served and Dramatiq's own tools still read the queues. Its fetch
(:meth:`FleetRedisBroker.fetch_with_ids`, ``fetch.lua``) is Dramatiq's ``fetch`` plus the
queue's account lanes, round robin (:mod:`toolfleet.shared.tenancy.lanes`), and the
Redis id of each body. Dramatiq's own maintenance (``KEYS`` inside its dispatch script)
never runs here: toolfleet's runs instead (:mod:`.maintenance`). The broker heartbeat
Dramatiq writes on every fetch is written by the process's periodic heartbeat instead
(:class:`~toolfleet.worker.supervision.heartbeat.CatalogPublisher`).

A message that does not decode, or that decodes but could not be handled safely (see
:func:`unusable`), is dead-lettered on its own (:meth:`FleetRedisBroker.handle_poison`)
and answered ``rejected`` where a reply address can be read.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name, q_name
from dramatiq.message import Message

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
from toolfleet.worker.pipeline.ledger import InlineAck
from toolfleet.worker.supervision.redis_factory import redis_client

__all__ = [
    "ACK_RETRY_S",
    "FleetRedisBroker",
    "RECONNECT_BACKOFF_S",
    "hold_dispatch_through_migrations",
    "make_broker",
    "unusable",
]

logger = logging.getLogger("toolfleet.worker.consumer")

#: Seconds between attempts while Redis is unreachable (the last one repeats).
RECONNECT_BACKOFF_S = (0.05, 0.1, 0.2, 0.5, 1.0)
#: Seconds an acknowledgement or a dead-lettering is retried while Redis is unreachable.
ACK_RETRY_S = 10.0


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


def unknown_actor(message: Message[Any], actor_names: set[str] | frozenset[str]) -> str:
    """Why no queue of this worker has ``message``'s actor ("" when one has).

    A message naming another actor (not a toolfleet call) is a poison message: it is
    dead-lettered and answered ``rejected`` where a reply address can be read.
    """
    if message.actor_name in actor_names:
        return ""
    return f"no actor {str(message.actor_name)[:80]!r} on this worker"


def mismatch(message: Message[Any], redis_id: str | None) -> str:
    """Why ``message`` cannot be acknowledged by its own ``redis_message_id`` ("" if it can)."""
    stored = message.options.get("redis_message_id")
    if redis_id is None or stored == redis_id:
        return ""
    return f"redis_message_id {str(stored)[:80]!r} is not the key {redis_id!r} it is stored under"


class FleetRedisBroker(RedisBroker):
    """Dramatiq's ``RedisBroker`` as the worker loop's transport (no Dramatiq worker runs it).

    Attributes:
        on_poison: called with ``(queue, data, error)`` for a message that does not decode,
            after it was dead-lettered (the worker answers ``rejected`` where it can).
        poison_messages: how many such messages this broker dead-lettered.
    """

    on_poison: Callable[[str, bytes, Exception], None] | None = None
    poison_messages = 0
    _fetch_script: Any = None
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

    def inline_ack(self, queue_name: str, redis_id: str) -> InlineAck:
        """An acknowledgement of message ``redis_id`` of ``queue_name`` for a script to make.

        Dramatiq's ``ack`` (drop the id from this broker's acks set of the queue; if it was
        there, drop the body), done by :func:`~toolfleet.worker.pipeline.ledger.post_outcome`
        in the round trip that posts the reply; when the call ends unanswered (``done``
        still False) the loop acknowledges as Dramatiq does (:meth:`settle`).
        """
        return InlineAck(
            self._acks_key(queue_name), queue_msgs_key(self.namespace, queue_name), redis_id
        )

    def settle(self, queue_name: str, redis_id: str, *, failed: bool = False) -> None:
        """Acknowledge (or, ``failed``, dead-letter) a message as Dramatiq's consumer does.

        Retried for up to :data:`ACK_RETRY_S` while Redis is unreachable; then logged and
        left to recovery (the id stays in this broker's acks set).
        """
        settle = self.do_nack if failed else self.do_ack
        give_up = time.monotonic() + ACK_RETRY_S
        attempt = 0
        while True:
            try:
                settle(queue_name, redis_id)
                return
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() >= give_up:
                    logger.error("could not settle message %s of %s: %s",
                                 redis_id, queue_name, exc)  # fmt: skip
                    return
                time.sleep(RECONNECT_BACKOFF_S[min(attempt, len(RECONNECT_BACKOFF_S) - 1)])
                attempt += 1

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

    def fetch_claiming(
        self,
        queue_name: str,
        count: int,
        claims: tuple[list[str], list[Any], list[str]],
        expected: list[str],
        peek: int,
    ) -> tuple[dict[Any, Any], list[str], list[tuple[str, bytes | None, int, bytes, bytes]]]:
        """:meth:`fetch_with_ids` that claims the calls it takes in the same script.

        ``claims`` comes from :meth:`~toolfleet.worker.pipeline.ledger.Ledger.fetch_claim`
        for the ``expected`` ids (see ``fetch.lua``); ``peek`` ids at the queue's head are
        read after the batch left it.

        Returns:
            The switches hash as read with the batch, the ids now at the queue's head, and
            per message ``(redis id, body, state, value, cancel marker)``: state -1 not
            claimed here, 0 an outcome exists (value: it), 1 claimed (value: the token), 2
            claimed already (value: the owner's token).

        Raises:
            redis.RedisError: Redis failed.
        """
        if self._fetch_script is None:
            self._fetch_script = self.client.register_script(_FETCH_WITH_IDS)
        head_keys, argv, per_id = claims
        lanes = lane_keys(self.namespace, queue_name)
        keys = [
            queue_key(self.namespace, queue_name),
            self._acks_key(queue_name),
            queue_msgs_key(self.namespace, queue_name),
            lanes_active_key(self.namespace, queue_name),
            *head_keys,
            *lanes,
            *per_id,
        ]
        flat = self._fetch_script(keys, [count, len(lanes), *argv, peek, *expected])
        switches, head = flat[0], [as_text(i) for i in flat[1]]
        found = []
        for i in range(2, len(flat), 5):
            found.append((as_text(flat[i]), flat[i + 1], int(flat[i + 2]), flat[i + 3] or b"",
                          flat[i + 4] or b""))  # fmt: skip
        return dict(zip(switches[::2], switches[1::2], strict=True)), head, found

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
        """Dead-letter an undecodable message this worker fetched.

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
            except Exception:  # noqa: BLE001 - answering is best effort; the loop goes on
                logger.exception("could not answer the undecodable message")


def make_broker(
    url: str,
    namespace: str,
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
        factory: ``MODULE:ATTR`` of a ``redis.Redis`` factory, used instead of ``url``
            (Dramatiq's ``RedisBroker`` takes the ready client).
    """
    client = redis_client(url, factory=factory, health_check_interval=30)
    broker = FleetRedisBroker(  # type: ignore[no-untyped-call]
        client=client,
        namespace=group_namespace(namespace, group, cluster=is_cluster(client)),
        middleware=[],  # no Dramatiq worker runs this broker: no middleware
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
