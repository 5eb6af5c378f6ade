"""What both clients share about Redis: where it is, how its errors surface, and ``fork()``.

- **Where**: a URL (checked by :func:`toolfleet.shared.urls.check_redis_url`), or a
  redis-py client or connection pool the caller built (Sentinel, credential providers,
  custom TLS).
- **Errors**: at a public boundary a redis-py error becomes
  :class:`~toolfleet.shared.errors.ConnectionFailed` naming the Redis without its password;
  a wait that a call's deadline ended, not Redis, raises :class:`DeadlinePassed`.
- **fork()**: a client made before ``os.fork()`` (gunicorn ``--preload``, Celery prefork,
  ``multiprocessing`` with the fork start method) gets, in the child, its own identity,
  connections and threads on first use; :func:`track_forks` registers it with
  ``os.register_at_fork``.
"""

from __future__ import annotations

import logging
import os
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from toolfleet.shared.connect import async_client, is_cluster, is_cluster_url, sync_client
from toolfleet.shared.errors import ClientError, ConfigurationError, ConnectionFailed
from toolfleet.shared.settings import Settings
from toolfleet.shared.urls import check_redis_url, redacted_url

__all__ = [
    "FORKED_GIVEN_POOL",
    "DeadlinePassed",
    "RedisSource",
    "keep_parents",
    "connection_failed",
    "redis_source",
    "pool_of",
    "pool_where",
    "tcp_options",
    "track_forks",
    "async_command_pool",
    "async_reply_connection",
    "sync_connection",
]


class DeadlinePassed(redis.TimeoutError):
    """The call's deadline came before Redis answered (or was asked): the budget ran out.

    A ``redis.TimeoutError``, so code that handles Redis failures handles it too; the
    producer's core answers a call whose catalog read ends so ``timeout``, not
    ``not_available`` (:func:`toolfleet.producer._core.calls.catalog_refusal`).
    """


@dataclass(frozen=True)
class RedisSource:
    """Where a client's Redis is: a checked URL, or the caller's pool.

    Attributes:
        url: the URL, or ``None`` with a pool.
        pool: the caller's connection pool (sync or asyncio), or ``None`` with a URL.
        where: printable: the URL with its password masked, or the pool's address.
    """

    url: str | None
    pool: Any
    where: str


def redis_source(
    redis_url: str | None,
    settings: Settings,
    redis_client: Any,
    connection_pool: Any,
    *,
    asyncio: bool,
) -> RedisSource:
    """What a client's constructor arguments say about its Redis.

    A caller's client or pool wins over ``TOOLFLEET_REDIS_URL``; an explicit ``redis_url``
    with one of them is misuse.

    Raises:
        ConfigurationError: neither a URL nor a client/pool, or a URL redis-py cannot use.
        ClientError: see :func:`pool_of`, or a URL and a client/pool both given.
    """
    pool = pool_of(redis_client, connection_pool, asyncio=asyncio)
    if pool is not None:
        if redis_url:
            raise ClientError("pass redis_url or a Redis client/pool, not both")
        return RedisSource(None, pool, pool_where(pool))
    url = redis_url or settings.redis_url
    if not url:
        raise ConfigurationError(
            "no Redis URL: pass redis_url= (or redis_client=) or set TOOLFLEET_REDIS_URL"
        )
    return RedisSource(check_redis_url(url), None, redacted_url(url))


def tcp_options(url: str) -> dict[str, Any]:
    """``socket_keepalive`` for TCP URLs; nothing for ``unix://`` (its connection refuses it)."""
    return {} if url.lower().startswith("unix:") else {"socket_keepalive": True}


def pool_of(
    redis_client: Any,
    connection_pool: Any,
    *,
    asyncio: bool,
) -> Any:
    """The connection pool of what the caller handed a client (``None`` when nothing).

    A ``redis.cluster.RedisCluster`` (or its asyncio twin) stands for its own pool (it
    keeps one per node).

    Args:
        redis_client: a ``redis.Redis`` or ``redis.cluster.RedisCluster`` (sync), or a
            ``redis.asyncio.Redis`` or ``redis.asyncio.cluster.RedisCluster`` (asyncio),
            or None.
        connection_pool: a ``redis.ConnectionPool`` or ``redis.asyncio.ConnectionPool``
            (or a subclass: blocking, Sentinel), or None.
        asyncio: whether the client is ``AsyncToolClient``.

    Raises:
        ClientError: both given, the wrong flavour (sync for async or the reverse), or a
            pool that decodes responses (toolfleet reads bytes).
    """
    if redis_client is None and connection_pool is None:
        return None
    if redis_client is not None and connection_pool is not None:
        raise ClientError("pass redis_client= or connection_pool=, not both")
    client_type = redis.asyncio.Redis if asyncio else redis.Redis
    pool_type = redis.asyncio.ConnectionPool if asyncio else redis.ConnectionPool
    flavour = "redis.asyncio" if asyncio else "redis (sync)"
    if is_cluster(redis_client):
        cluster_type = redis.asyncio.cluster.RedisCluster if asyncio else redis.cluster.RedisCluster
        if not isinstance(redis_client, cluster_type):
            raise ClientError(f"redis_client must be a {flavour} client, not {redis_client!r}")
        if redis_client.get_encoder().decode_responses:
            raise ClientError("the Redis client must not decode responses (decode_responses=False)")
        return redis_client
    if redis_client is not None:
        if not isinstance(redis_client, client_type):
            raise ClientError(f"redis_client must be a {flavour} client, not {redis_client!r}")
        pool = redis_client.connection_pool
    else:
        pool = connection_pool
    if not isinstance(pool, pool_type):
        raise ClientError(f"connection_pool must be a {flavour} ConnectionPool, not {pool!r}")
    if pool.connection_kwargs.get("decode_responses"):
        raise ClientError("the Redis client must not decode responses (decode_responses=False)")
    return pool


def pool_where(pool: Any) -> str:
    """A printable description of a caller's pool: its address, never its password."""
    if isinstance(pool, redis.cluster.RedisCluster):
        nodes = ",".join(f"{n.host}:{n.port}" for n in pool.get_primaries())  # type: ignore[no-untyped-call]
        return f"redis+cluster://{nodes}"
    if isinstance(pool, redis.asyncio.cluster.RedisCluster):
        seeds = pool.nodes_manager.startup_nodes.values()
        return "redis+cluster://" + ",".join(sorted(f"{n.host}:{n.port}" for n in seeds))
    kwargs = pool.connection_kwargs
    service = getattr(pool, "service_name", None)
    if service:
        return f"Sentinel service {service!r}"
    if kwargs.get("path"):
        return f"unix://{kwargs['path']}"
    host, port, db = kwargs.get("host", "localhost"), kwargs.get("port", 6379), kwargs.get("db", 0)
    return f"redis://{host}:{port}/{db}"


def connection_failed(exc: BaseException, where: str, doing: str) -> ConnectionFailed:
    """The :class:`ConnectionFailed` for a redis-py error ``exc`` while ``doing`` something.

    Args:
        exc: the redis-py (or socket) error.
        where: the Redis, printable (a redacted URL or :func:`pool_where`).
        doing: what failed, e.g. ``"reading the tool catalog"``.
    """
    url = where if "://" in where else ""  # a Sentinel service has no URL
    return ConnectionFailed(f"Redis at {where} failed {doing}: {exc}", url=url)


def sync_connection(
    source: Any, name: str, timeout_s: float | None, *, single: bool
) -> redis.Redis:
    """A sync client on the caller's pool, or on ``source.url`` named ``name``.

    ``timeout_s``: socket and connect timeout (``None`` for the reply listener's
    blocking reads); ``single``: a client of one connection of its own.

    Raises:
        ConnectionFailed: a cluster URL none of whose nodes answers (a cluster client
            connects as it is made; a plain one on its first command).
    """
    if isinstance(source.pool, redis.cluster.RedisCluster):
        return source.pool  # type: ignore[return-value]  # it routes like a redis.Redis
    if source.pool is not None:
        return redis.Redis(connection_pool=source.pool)
    try:  # a cluster client reads the cluster's slots as it is made
        return sync_client(source.url, client_name=name, socket_timeout=timeout_s,  # type: ignore[return-value]
                           socket_connect_timeout=timeout_s,
                           single_connection_client=single)  # fmt: skip
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        raise connection_failed(exc, redacted_url(source.url), "connecting") from exc


def async_command_pool(source: Any, name: str, timeout_s: float, size: int) -> Any:
    """The asyncio command pool: the caller's, or a blocking one of ``size`` connections.

    On a cluster URL it is a ``redis.asyncio.cluster.RedisCluster`` (a pool per node, of
    at most ``size`` connections each); a caller's cluster client is used as it is.
    """
    if source.pool is not None:
        return source.pool
    if is_cluster_url(source.url):
        return async_client(source.url, max_connections=size, client_name=name,
                            socket_timeout=timeout_s, socket_connect_timeout=timeout_s)  # fmt: skip
    return redis.asyncio.BlockingConnectionPool.from_url(
        source.url, max_connections=size, timeout=timeout_s, client_name=name,
        socket_timeout=timeout_s, socket_connect_timeout=timeout_s)  # fmt: skip


def async_reply_connection(source: Any, name: str, connect_timeout_s: float) -> redis.asyncio.Redis:
    """The asyncio reply listener's connection: one of its own, no socket timeout.

    On a cluster it is a ``redis.asyncio.cluster.RedisCluster`` of its own (no socket
    timeout), shared by the listeners of every group: each ``BLPOP`` holds one
    connection to its list's master while it waits, and the cluster client follows
    ``MOVED``/``ASK`` and topology changes. A caller's cluster client is used as it is.

    Keepalive instead of a read timeout: one that fires while the loop was busy would
    drop replies ``BLPOP`` had popped, and redis-py wraps timed writes in ``wait_for``,
    which on Python 3.11 can swallow a cancellation. Deadlines never depend on it (they
    are loop timers).
    """
    if isinstance(source.pool, redis.asyncio.cluster.RedisCluster):
        return source.pool  # type: ignore[return-value]  # it routes like a redis.asyncio.Redis
    if source.pool is not None:
        return redis.asyncio.Redis(connection_pool=source.pool)
    if is_cluster_url(source.url):
        return async_client(source.url, socket_timeout=None, client_name=name,  # type: ignore[return-value]
                            socket_connect_timeout=connect_timeout_s)  # fmt: skip
    return async_client(source.url, socket_timeout=None, client_name=name,  # type: ignore[return-value]
                        single_connection_client=True,
                        socket_connect_timeout=connect_timeout_s,
                        **tcp_options(source.url))  # fmt: skip


class _ForkAware(Protocol):
    def _after_fork(self) -> None: ...


_log = logging.getLogger(__name__)
_tracked: weakref.WeakSet[Any] = weakref.WeakSet()


def _reset_children() -> None:
    # one client's failure (say, a cluster client whose nodes are gone) must not leave the
    # others with their parent's state: each is reset on its own
    for client in list(_tracked):
        try:
            client._after_fork()
        except Exception as exc:  # noqa: BLE001 - reported, the next client still reset
            _log.warning("a client was not reset after fork(): %s: %s", type(exc).__name__, exc)


os.register_at_fork(after_in_child=_reset_children)


def track_forks(client: _ForkAware) -> None:
    """Call ``client._after_fork()`` in the child of every later ``os.fork()``.

    ``_after_fork`` runs in the child right after the fork, with one thread: it must
    only swap in fresh state (no I/O, no threads, no lock of the old state); threads and
    connections start on the client's next use. The client is held weakly.
    """
    _tracked.add(client)


#: Why an ``AsyncToolClient`` built on a caller's client or pool fails in a forked child.
FORKED_GIVEN_POOL = (
    "this AsyncToolClient was built on your redis.asyncio client/pool before "
    "fork(): redis.asyncio pools cannot be shared with a child process; build "
    "the client (and its pool) in the child, e.g. in gunicorn's post_fork hook"
)

#: In a forked child: the parent's async pools and listeners of every client.
_parents_connections: list[object] = []


def keep_parents(*connections: object) -> None:
    """In a forked child, keep the parent's ``redis.asyncio`` objects referenced forever.

    Never collected, never closed here: closing them from the child's loop (redis.asyncio
    does on garbage collection) could write on sockets the parent still uses.
    """
    _parents_connections.append(connections)
