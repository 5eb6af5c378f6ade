"""Pipelines that also work on a Redis Cluster.

redis-py's cluster pipeline refuses ``EVALSHA``, ``EVAL`` and ``PUBLISH`` (and ``MULTI``
across slots), which toolfleet pipelines. On a cluster, :func:`pipeline` gives an
:class:`InOrder` pipeline instead: the same queue-then-``execute`` interface, each command
sent on its own, in order, routed by the cluster client (one round trip per command:
batching per node is not done yet). On a plain Redis it is redis-py's pipeline, unchanged.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio.cluster
from redis.exceptions import AskError, MovedError, RedisClusterException, TryAgainError

from toolfleet.shared.connect import ClusterUnavailableError, is_cluster

__all__ = ["AsyncInOrder", "InOrder", "on_one_connection", "pipeline"]

#: Attempts of :func:`on_one_connection` on a cluster that redirects (``MOVED``, ``ASK``)
#: or answers ``TRYAGAIN``, and the seconds slept before a ``TRYAGAIN`` retry (the last
#: one repeats: about 4 s in all).
ONE_CONNECTION_ATTEMPTS = 12
_TRYAGAIN_BACKOFF_S = (0.05, 0.1, 0.2, 0.4, 0.5)


class InOrder:
    """Commands queued like a pipeline's and sent one by one by :meth:`execute`.

    Attributes:
        command_stack: the queued ``(method, args, kwargs)``, as a pipeline's stack.
    """

    def __init__(self, client: Any) -> None:
        self._client = client
        self.command_stack: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., InOrder]:
        method = getattr(self._client, name)

        def queue(*args: Any, **kwargs: Any) -> InOrder:
            self.command_stack.append((method, args, kwargs))
            return self

        return queue

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        """Send every queued command in order; their replies.

        Args:
            raise_on_error: raise the first ``redis.RedisError``; with ``False`` it takes
                that command's place in the replies, as in a pipeline.

        Raises:
            redis.RedisError: a command failed (with ``raise_on_error``).
        """
        stack, self.command_stack = self.command_stack, []
        replies: list[Any] = []
        for method, args, kwargs in stack:
            try:
                replies.append(method(*args, **kwargs))
            except redis.ConnectionError:
                raise
            except redis.RedisError as exc:
                if raise_on_error:
                    raise
                replies.append(exc)
        return replies


class AsyncInOrder(InOrder):
    """:class:`InOrder` for ``redis.asyncio.cluster.RedisCluster``: ``await execute()``."""

    async def execute(self, raise_on_error: bool = True) -> list[Any]:  # type: ignore[override]
        """Send every queued command in order, awaiting each; their replies.

        Raises:
            redis.RedisError: as :meth:`InOrder.execute`.
        """
        stack, self.command_stack = self.command_stack, []
        replies: list[Any] = []
        for method, args, kwargs in stack:
            try:
                replies.append(await method(*args, **kwargs))
            except redis.ConnectionError:
                raise
            except redis.RedisError as exc:
                if raise_on_error:
                    raise
                replies.append(exc)
        return replies


def pipeline(client: Any, *, transaction: bool = False) -> Any:
    """``client.pipeline(transaction=...)``, or an :class:`InOrder` one on a cluster.

    On an asyncio cluster client it is an :class:`AsyncInOrder`.

    On a cluster, ``transaction`` is not kept: the commands run in order, not as one
    ``MULTI`` (each caller's order is what its correctness rests on).
    """
    if isinstance(client, redis.asyncio.cluster.RedisCluster):
        return AsyncInOrder(client)
    if is_cluster(client):
        return InOrder(client)
    return client.pipeline(transaction=transaction)


def on_one_connection(client: Any, key: str, commands: Sequence[tuple[Any, ...]]) -> list[Any]:
    """Send ``commands`` on one connection, in one round trip; their replies.

    For commands whose meaning is per connection, like ``WAIT`` after a write (it waits
    for the writes *this connection* made). On a plain Redis: a non-transactional
    pipeline. On a cluster: a pipeline on one connection of the master serving ``key``'s
    slot; a ``MOVED`` reply to the first command refreshes the slot map and sends them
    again, an ``ASK`` sends them to the importing master after ``ASKING``, a ``TRYAGAIN``
    sends them again after a backoff (the first command must therefore be one whose
    refusal left nothing written: a command on a slot's keys).

    Args:
        client: ``redis.Redis`` or ``redis.cluster.RedisCluster``.
        key: a key of the slot the commands act on.
        commands: each a command's arguments, e.g. ``("EVALSHA", sha, 1, key)``.

    Returns:
        One reply per command; a command Redis refused has its ``redis.ResponseError``
        in its place (as ``execute(raise_on_error=False)``).

    Raises:
        redis.ConnectionError, redis.TimeoutError: Redis unreachable.
        ClusterUnavailableError: on a cluster, still redirected or ``TRYAGAIN`` after
            :data:`ONE_CONNECTION_ATTEMPTS` attempts.
    """
    if not is_cluster(client):
        pipe = client.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))
    node = client.get_node_from_key(key)
    asking = False
    error: Exception | None = None
    for attempt in range(ONE_CONNECTION_ATTEMPTS):
        pipe = client.get_redis_connection(node).pipeline(transaction=False)
        if asking:
            pipe.execute_command("ASKING")
        for command in commands:
            pipe.execute_command(*command)
        try:
            replies = list(pipe.execute(raise_on_error=False))
        except (redis.ConnectionError, redis.TimeoutError):
            _refresh(client)  # the master may have failed over: the next call asks anew
            raise
        if asking:
            replies = replies[1:]
        first = replies[0] if replies else None
        asking = False
        if isinstance(first, MovedError):  # the slot moved for good: the new slot map
            client.nodes_manager.initialize()
            node = client.get_node_from_key(key)
        elif isinstance(first, AskError):  # the key is at the importing master
            node = client.get_node(host=first.host, port=first.port) or node
            asking = True
        elif isinstance(first, TryAgainError):  # keys split by a migration under way
            time.sleep(_TRYAGAIN_BACKOFF_S[min(attempt, len(_TRYAGAIN_BACKOFF_S) - 1)])
        else:
            return replies
        error = first
    raise ClusterUnavailableError(
        f"{commands[0][0]} on {key!r}: still redirected after {ONE_CONNECTION_ATTEMPTS} "
        f"attempts: {error}"
    )


def _refresh(client: Any) -> None:
    """Reload a cluster client's slot map, if some node answers."""
    with contextlib.suppress(redis.RedisError, RedisClusterException):
        client.nodes_manager.initialize()
