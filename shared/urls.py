"""Redis URLs as they may be shown to a person: with the password masked."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlsplit

import redis.connection

from toolfleet.shared.connect import CLUSTER_SCHEMES, cluster_seeds
from toolfleet.shared.errors import ConfigurationError

__all__ = ["REDIS_SCHEMES", "check_redis_url", "redacted_url", "url_passwords"]

#: URL schemes toolfleet connects to: redis-py's ``from_url`` ones, and a Redis Cluster
#: named by its seed nodes (:mod:`toolfleet.shared.connect`).
REDIS_SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")


def redacted_url(url: str | None) -> str:
    """Return ``url`` with any password replaced by ``***`` (``""`` for ``None``).

    ``redis://user:pw@host:6379/0`` → ``redis://user:***@host:6379/0``; a ``password=``
    query parameter is masked the same way. A string that is not a URL is returned
    unchanged but for such a query parameter. Safe for logs, errors and replies.
    """
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparsable URL>"
    masked = url
    if "@" in parts.netloc:
        userinfo, host = parts.netloc.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}:***@{host}" if ":" in userinfo else f"***@{host}"
        masked = masked.replace(parts.netloc, netloc, 1)
    if parts.query:
        query = "&".join(
            "password=***" if pair.lower().startswith("password=") else pair
            for pair in parts.query.split("&")
        )
        masked = masked.replace(parts.query, query, 1)
    return masked


def url_passwords(url: str | None) -> set[str]:
    """The passwords ``url`` holds: the ones :func:`redacted_url` masks, to scrub by value.

    ``redis://user:pw@host/0`` and ``unix:///s.sock?password=pw`` both give ``{"pw"}``; a
    percent-encoded password is given both as written and decoded (``p%40ss`` and
    ``p@ss``). Empty for ``None``, an unparsable URL or one without a password.
    """
    if not url:
        return set()
    try:
        parts = urlsplit(url)
    except ValueError:
        return set()
    found = set()
    if "@" in parts.netloc:
        userinfo = parts.netloc.rsplit("@", 1)[0]
        if ":" in userinfo:
            found.add(userinfo.split(":", 1)[1])
    for pair in parts.query.split("&"):
        if pair.lower().startswith("password="):
            found.add(pair.split("=", 1)[1])
    found |= {unquote(value) for value in found}
    found |= {value for key, value in parse_qsl(parts.query) if key.lower() == "password"}
    return {value for value in found if value}


def check_redis_url(url: str) -> str:
    """Return ``url`` when redis-py can connect to it (producer and worker accept the same).

    The URL is parsed as redis-py parses it when it connects (``redis.connection.parse_url``),
    so a port that is not a number, a broken IPv6 host or a bad query value is refused here,
    in one line, rather than as a ``ValueError`` traceback from deep inside a client.

    Raises:
        ConfigurationError: no scheme, an unknown one, ``redis+sentinel://`` (redis-py
            has no Sentinel URLs: pass ``Sentinel(...).master_for(...)`` to a client as
            ``redis_client=``, and ``--redis-client MODULE:ATTR`` to ``toolfleet worker``),
            or a URL redis-py's parser refuses; the message never holds the password.
    """
    try:
        scheme = urlsplit(url).scheme.lower() if "://" in url else ""
    except ValueError as exc:
        raise _unusable(url, exc) from None
    if scheme.startswith("redis+sentinel") or scheme == "sentinel":
        raise ConfigurationError(
            f"{redacted_url(url)}: Sentinel URLs are not supported; pass a client made by "
            "redis.sentinel.Sentinel(...).master_for(...) as redis_client= (workers: "
            "--redis-client MODULE:ATTR or TOOLFLEET_REDIS_CLIENT, a factory returning it)"
        )
    if scheme not in REDIS_SCHEMES:
        raise ConfigurationError(
            f"{redacted_url(url)!r} is not a Redis URL: use redis://host:port/db, "
            "rediss:// (TLS), unix:///path/to/socket, or a cluster: "
            "redis+cluster://host:port[,host:port...] (rediss+cluster:// with TLS)"
        )
    # a cluster URL's seed list first (raises on a malformed one), then what redis-py reads
    first = cluster_seeds(url).first_url if scheme in CLUSTER_SCHEMES else url
    try:
        redis.connection.parse_url(first)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise _unusable(url, exc) from None
    return url


def _unusable(url: str, exc: ValueError) -> ConfigurationError:
    """The one-line error of a URL redis-py cannot parse (its passwords masked)."""
    why = str(exc)
    for password in url_passwords(url):
        why = why.replace(password, "***")
    return ConfigurationError(f"{redacted_url(url)!r} is not a usable Redis URL: {why}")
