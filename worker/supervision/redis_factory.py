"""Redis clients made by an operator's factory (``--redis-client MODULE:ATTR``).

A URL cannot express Sentinel, credential providers (IAM / Entra ID tokens) or a custom
TLS context; a factory can: a callable taking no arguments and returning a ready
``redis.Redis``. Worker processes are spawned, not forked, so each process imports the
factory and calls it itself (``TOOLFLEET_REDIS_CLIENT`` reaches every process through
:class:`~toolfleet.shared.settings.Settings`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import redis
import redis.cluster

from toolfleet.shared.connect import AnyRedis, sync_client
from toolfleet.shared.errors import ConfigurationError

__all__ = ["factory_client", "load_factory", "redis_client"]


def load_factory(spec: str) -> Callable[[], Any]:
    """Import the factory ``MODULE:ATTR`` (``ATTR`` may be dotted).

    Raises:
        ConfigurationError: a malformed spec, a module that fails to import, a missing
            attribute, or one that is not callable.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--redis-client {spec!r}: expected MODULE:ATTR")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except ImportError as exc:
        message = f"--redis-client {spec}: cannot import {module_name}: {exc}"
        raise ConfigurationError(message) from None
    except AttributeError:
        raise ConfigurationError(f"--redis-client {spec}: {module_name} has no {attr}") from None
    if not callable(target):
        raise ConfigurationError(f"--redis-client {spec}: {attr} is not callable")
    return target  # type: ignore[no-any-return]


def factory_client(spec: str) -> redis.Redis:  # a RedisCluster is accepted too
    """Call the factory ``spec`` names; return its client.

    Raises:
        ConfigurationError: as :func:`load_factory`, or the factory raised or returned
            something that is not a sync ``redis.Redis`` or ``redis.cluster.RedisCluster``
            (or one decoding responses).
    """
    factory = load_factory(spec)
    try:
        client = factory()
    except Exception as exc:  # noqa: BLE001 - reported as the operator's configuration
        raise ConfigurationError(f"--redis-client {spec}: the factory raised {exc!r}") from exc
    if isinstance(client, redis.cluster.RedisCluster):
        if client.get_encoder().decode_responses:  # type: ignore[no-untyped-call]
            raise ConfigurationError(f"--redis-client {spec}: the client must not decode responses")
        return client  # type: ignore[return-value]
    if not isinstance(client, redis.Redis):
        raise ConfigurationError(
            f"--redis-client {spec}: returned {type(client).__name__}, not a redis.Redis"
        )
    if client.connection_pool.connection_kwargs.get("decode_responses"):
        raise ConfigurationError(f"--redis-client {spec}: the client must not decode responses")
    return client


def redis_client(url: str, *, factory: str | None = None, **options: Any) -> redis.Redis:
    """A redis-py client: the operator's ``factory`` one when named, else one for ``url``.

    Args:
        url: ``redis://``, ``rediss://``, ``unix://`` or ``redis+cluster://`` URL (unused
            with a factory); see :mod:`toolfleet.shared.connect`.
        factory: ``MODULE:ATTR`` of a callable returning a ``redis.Redis`` (see
            :mod:`toolfleet.worker.supervision.redis_factory`); ``options`` do not apply to it.
        **options: keyword arguments of ``redis.Redis.from_url``.

    Raises:
        ConfigurationError: the factory cannot be loaded or returned no ``redis.Redis``.
    """
    if factory:
        return factory_client(factory)
    client: AnyRedis = sync_client(url, **options)
    return client  # type: ignore[return-value]
