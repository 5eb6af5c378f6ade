"""A client's configuration: its constructor arguments, checked once for both clients."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from toolfleet.producer._core.calls import check_timeout
from toolfleet.producer._redis import redis_source
from toolfleet.shared.errors import ClientError
from toolfleet.shared.naming import reply_key
from toolfleet.shared.settings import Settings

__all__ = ["ClientConfig", "Identity", "configure"]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """What a client was built with.

    Attributes:
        settings: the settings (given, or read from ``TOOLFLEET_*``).
        namespace: the key prefix.
        max_in_flight: most calls published and not yet resolved.
        submit_timeout_s: seconds ``submit`` waits for an in-flight slot.
        url: the Redis URL, or ``None`` for a caller's client or pool.
        pool: the caller's connection pool, or ``None`` with a URL.
        where: the Redis, printable (password masked).
    """

    settings: Settings
    namespace: str
    max_in_flight: int
    submit_timeout_s: float
    url: str | None
    pool: Any
    where: str


@dataclass(frozen=True, slots=True)
class Identity:
    """One process's identity of a client: its id and reply list (new after ``fork()``)."""

    client_id: str
    reply_to: str

    @classmethod
    def new(cls, namespace: str) -> Identity:
        """A fresh identity in ``namespace``."""
        client_id = uuid.uuid4().hex
        return cls(client_id, reply_key(namespace, client_id))


def configure(
    redis_url: str | None,
    *,
    namespace: str | None,
    settings: Settings | None,
    redis_client: Any,
    connection_pool: Any,
    max_in_flight: Any,
    submit_timeout_s: Any,
    asyncio: bool,
) -> ClientConfig:
    """Check a client's constructor arguments.

    Raises:
        ConfigurationError: no Redis URL given or configured, or not a Redis URL.
        ClientError: ``max_in_flight`` below 1, a bad ``submit_timeout_s``, both
            ``redis_client`` and ``connection_pool``, or an unfit one.
    """
    settings = settings or Settings.from_env(redis_url=redis_url, namespace=namespace)
    source = redis_source(redis_url, settings, redis_client, connection_pool, asyncio=asyncio)
    if not isinstance(max_in_flight, int) or max_in_flight < 1:
        raise ClientError("max_in_flight must be an integer >= 1")
    return ClientConfig(
        settings=settings,
        namespace=namespace or settings.namespace,
        max_in_flight=max_in_flight,
        submit_timeout_s=check_timeout(submit_timeout_s),
        url=source.url,
        pool=source.pool,
        where=source.where,
    )
