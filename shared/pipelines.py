"""Pipelines that also work on a Redis Cluster.

redis-py's cluster pipeline refuses ``EVALSHA``, ``EVAL`` and ``PUBLISH`` (and ``MULTI``
across slots), which toolfleet pipelines. On a cluster, :func:`pipeline` gives an
:class:`InOrder` pipeline instead: the same queue-then-``execute`` interface, each command
sent on its own, in order, routed by the cluster client (one round trip per command:
batching per node is not done yet). On a plain Redis it is redis-py's pipeline, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio.cluster

from toolfleet.shared.connect import is_cluster

__all__ = ["AsyncInOrder", "InOrder", "pipeline"]


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
