"""The one place a Redis URL becomes a redis-py client: a single Redis or a Redis Cluster.

URLs (checked by :func:`toolfleet.shared.urls.check_redis_url`):

- ``redis://``, ``rediss://``, ``unix://``: one Redis, ``redis.Redis.from_url``.
- ``redis+cluster://[user:password@]host:port[,host:port...][/0][?options]`` and
  ``rediss+cluster://...`` (TLS): a Redis (or Valkey) Cluster given by its seed nodes,
  ``redis.cluster.RedisCluster``; credentials, TLS and query options as for ``redis://``
  (they apply to every node). A cluster has only database 0.

Whether a URL names a cluster also decides the key layout
(:class:`toolfleet.shared.naming.KeyLayout`).

A cluster client made here retries the errors a cluster gives while it reconfigures,
which redis-py's cluster client follows only a few times, without pause
(:data:`TRANSIENT_CLUSTER_ERRORS`): ``TRYAGAIN`` (a multi-key command or script on a slot
being migrated), ``CLUSTERDOWN`` and a slot without a master (a failover under way), and
the "TTL exhausted" redis-py raises after following ``ASK``/``TRYAGAIN`` redirections 16
times. It retries each command up to :data:`TRANSIENT_RETRIES` times with exponential
backoff and jitter (redis-py's ``Retry`` and ``ExponentialWithJitterBackoff``, at most
:data:`TRANSIENT_BACKOFF_CAP_S` between attempts: about 4 s in all); past that it raises
:class:`ClusterUnavailableError`, a ``redis.ConnectionError``, so every caller treats a
slot that stays unavailable as it treats an unreachable Redis (the worker retries until
the call's deadline, a producer answers ``not_available``) instead of meeting an
unexpected exception. ``MOVED`` and single ``ASK`` redirections stay redis-py's own.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.retry
import redis.cluster
import redis.retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import (
    ClusterError,
    RedisClusterException,
    TryAgainError,
)

from toolfleet.shared.errors import ConfigurationError

__all__ = [
    "CLUSTER_SCHEMES",
    "TRANSIENT_BACKOFF_CAP_S",
    "TRANSIENT_CLUSTER_ERRORS",
    "TRANSIENT_RETRIES",
    "AnyRedis",
    "AsyncRetryingCluster",
    "ClusterSeeds",
    "ClusterUnavailableError",
    "RetryingCluster",
    "address_of",
    "async_client",
    "cluster_seeds",
    "is_cluster",
    "is_cluster_url",
    "sync_client",
]

#: URL schemes that name a Redis Cluster by its seed nodes.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")

#: A sync client of either kind.
AnyRedis = redis.Redis | redis.cluster.RedisCluster

#: Client options that only make sense on one connection to one Redis.
_SINGLE_NODE_ONLY = frozenset({"single_connection_client", "connection_pool"})

#: Errors of a cluster that reconfigures: ``TryAgainError`` (``TRYAGAIN``), ``ClusterError``
#: (``ClusterDownError``/``MasterDownError`` for ``CLUSTERDOWN``/``MASTERDOWN``, and
#: redis-py's "TTL exhausted" after 16 redirections), ``RedisClusterException`` (redis-py's
#: ``SlotNotCoveredError``: no known node serves the slot yet).
TRANSIENT_CLUSTER_ERRORS: tuple[type[Exception], ...] = (
    TryAgainError,
    ClusterError,
    RedisClusterException,
)
#: Retries of one command after a transient cluster error (then it raises).
TRANSIENT_RETRIES = 10
#: Seconds: the first backoff is up to 0.05 s, doubling up to this cap (with full jitter).
TRANSIENT_BACKOFF_CAP_S = 0.5
_TRANSIENT_BACKOFF_BASE_S = 0.05


class ClusterUnavailableError(redis.ConnectionError):
    """A cluster slot stayed unavailable through every retry (``TRYAGAIN``, ``CLUSTERDOWN``...).

    A ``redis.ConnectionError``: callers handle it as an unreachable Redis. ``__cause__``
    is the last cluster error.
    """


def _transient_retry() -> redis.retry.Retry:
    backoff = ExponentialWithJitterBackoff(
        cap=TRANSIENT_BACKOFF_CAP_S, base=_TRANSIENT_BACKOFF_BASE_S
    )
    return redis.retry.Retry(backoff, TRANSIENT_RETRIES, TRANSIENT_CLUSTER_ERRORS)


def _unavailable(args: tuple[Any, ...], error: Exception) -> ClusterUnavailableError:
    command = str(args[0]) if args else "?"
    return ClusterUnavailableError(
        f"{command}: the cluster slot stayed unavailable after {TRANSIENT_RETRIES} retries: "
        f"{type(error).__name__}: {error}"
    )


class RetryingCluster(redis.cluster.RedisCluster):
    """``redis.cluster.RedisCluster`` that retries transient cluster errors with backoff.

    Each command (scripts included: they run ``EVALSHA`` through
    :meth:`execute_command`) is retried on :data:`TRANSIENT_CLUSTER_ERRORS` up to
    :data:`TRANSIENT_RETRIES` times, redis-py's own redirections and retries running
    inside each attempt.

    Raises:
        ClusterUnavailableError: (from any command) still failing after the last retry.
    """

    _transient = _transient_retry()

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """Run one command as redis-py does, retried on transient cluster errors."""
        run = super().execute_command
        try:
            return self._transient.call_with_retry(lambda: run(*args, **kwargs), _ignore)  # type: ignore[no-untyped-call]
        except TRANSIENT_CLUSTER_ERRORS as exc:
            raise _unavailable(args, exc) from exc


class AsyncRetryingCluster(redis.asyncio.cluster.RedisCluster):
    """The asyncio twin of :class:`RetryingCluster` (``redis.asyncio.retry.Retry``).

    Raises:
        ClusterUnavailableError: (from any command) still failing after the last retry.
    """

    _transient = redis.asyncio.retry.Retry(
        ExponentialWithJitterBackoff(cap=TRANSIENT_BACKOFF_CAP_S, base=_TRANSIENT_BACKOFF_BASE_S),
        TRANSIENT_RETRIES,
        TRANSIENT_CLUSTER_ERRORS,  # type: ignore[arg-type,unused-ignore]  # SlotNotCoveredError is no RedisError
    )

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        """Run one command as redis-py does, retried on transient cluster errors."""
        run = super().execute_command

        async def attempt() -> Any:
            return await run(*args, **kwargs)

        async def ignore(error: Exception) -> None:
            return None

        try:
            return await self._transient.call_with_retry(attempt, ignore)
        except TRANSIENT_CLUSTER_ERRORS as exc:
            raise _unavailable(args, exc) from exc


def _ignore(error: Exception) -> None:
    """``Retry``'s failure hook: nothing to do between attempts."""


def is_cluster_url(url: str | None) -> bool:
    """True when ``url``'s scheme is ``redis+cluster`` or ``rediss+cluster`` (any case)."""
    return bool(url) and str(url).split("://", 1)[0].lower() in CLUSTER_SCHEMES


#: client class -> whether it is a cluster client (redis-py's cluster classes are
#: protocols to ``isinstance``: a Python-level check each time, asked on every call)
_CLUSTER_CLASSES: dict[type, bool] = {}


def is_cluster(client: object) -> bool:
    """True for a ``redis.cluster.RedisCluster`` or ``redis.asyncio.cluster.RedisCluster``.

    Decided once per client class.
    """
    kind = type(client)
    known = _CLUSTER_CLASSES.get(kind)
    if known is None:
        known = isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))
        if len(_CLUSTER_CLASSES) < 1024:  # a bound on memory, not a policy
            _CLUSTER_CLASSES[kind] = known
    return known


class ClusterSeeds:
    """A cluster URL taken apart.

    Attributes:
        first_url: ``redis://`` (or ``rediss://``) URL of the first seed, with the
            credentials, database and query of the cluster URL (redis-py parses it).
        others: ``(host, port)`` of the further seeds.
    """

    def __init__(self, first_url: str, others: list[tuple[str, int]]) -> None:
        self.first_url = first_url
        self.others = others


def cluster_seeds(url: str) -> ClusterSeeds:
    """Split ``redis+cluster://[cred@]h1:p1,h2:p2[/0][?q]`` into its seeds.

    Raises:
        ConfigurationError: not a cluster URL, no seed, a seed without a port number, or
            a database other than 0.
    """
    scheme, _, rest = url.partition("://")
    if scheme.lower() not in CLUSTER_SCHEMES:
        raise ConfigurationError(f"not a cluster URL (want {' or '.join(CLUSTER_SCHEMES)}://)")
    netloc, slash, tail = rest.partition("/")
    if "?" in netloc:  # no path: the query follows the hosts
        netloc, _, query = netloc.partition("?")
        tail, slash = "?" + query, "/"
    credentials, at, hosts = netloc.rpartition("@")
    seeds = []
    for part in hosts.split(","):
        host, colon, port = part.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ConfigurationError(f"cluster seed {part!r}: expected host:port")
        seeds.append((host, int(port)))
    if tail.split("?", 1)[0] not in ("", "0"):
        raise ConfigurationError("a Redis Cluster has only database 0")
    single = "rediss" if scheme.lower().startswith("rediss") else "redis"
    first = f"{single}://{credentials}{at}{seeds[0][0]}:{seeds[0][1]}{slash}{tail}"
    return ClusterSeeds(first, seeds[1:])


def sync_client(url: str, **options: Any) -> AnyRedis:
    """A sync client for ``url``: ``redis.Redis`` or, for a cluster URL, :class:`RetryingCluster`.

    Args:
        url: a URL :func:`toolfleet.shared.urls.check_redis_url` accepts.
        **options: keyword arguments of ``redis.Redis.from_url`` (socket timeouts,
            ``client_name``, ``health_check_interval``...); for a cluster those that
            name one connection (``single_connection_client``) are dropped: redis-py's
            cluster client keeps a pool per node.

    Raises:
        ConfigurationError: a malformed cluster URL (see :func:`cluster_seeds`).
    """
    if not is_cluster_url(url):
        return redis.Redis.from_url(url, **options)
    seeds = cluster_seeds(url)
    nodes = [redis.cluster.ClusterNode(h, p) for h, p in seeds.others]  # type: ignore[no-untyped-call]
    kept = {k: v for k, v in options.items() if k not in _SINGLE_NODE_ONLY}
    return RetryingCluster.from_url(seeds.first_url, startup_nodes=nodes, **kept)


def async_client(
    url: str, **options: Any
) -> redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster:
    """The asyncio twin of :func:`sync_client` (a cluster: :class:`AsyncRetryingCluster`).

    Raises:
        ConfigurationError: a malformed cluster URL (see :func:`cluster_seeds`).
    """
    if not is_cluster_url(url):
        return redis.asyncio.Redis.from_url(url, **options)
    seeds = cluster_seeds(url)
    nodes = [redis.asyncio.cluster.ClusterNode(h, p) for h, p in seeds.others]
    kept = {k: v for k, v in options.items() if k not in _SINGLE_NODE_ONLY}
    return AsyncRetryingCluster.from_url(seeds.first_url, startup_nodes=nodes, **kept)


def address_of(client: Any) -> str:
    """Which Redis ``client`` talks to, as a stable string (no password).

    A single Redis: its socket path or host, port and database; a cluster: its sorted
    startup nodes (the same for every client made from one URL).
    """
    if is_cluster(client):
        nodes = client.nodes_manager.startup_nodes
        return "cluster:" + ",".join(sorted(str(name) for name in nodes))
    kwargs = client.connection_pool.connection_kwargs
    return repr([kwargs.get(k) for k in ("path", "host", "port", "db")])
