"""Cluster URLs: ``redis+cluster://`` seeds become a ``RedisCluster``, checked like any URL."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest
import redis
import redis.cluster
from private_cluster import Cluster, start_cluster

from toolfleet.producer import ToolClient
from toolfleet.shared.connect import (
    AsyncRetryingCluster,
    ClusterUnavailableError,
    async_client,
    cluster_seeds,
    is_cluster_url,
    sync_client,
)
from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.urls import check_redis_url, redacted_url


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = start_cluster(tmp_path_factory.mktemp("cluster"), masters=3)
    yield started
    started.stop()


def test_cluster_url_seeds_credentials_and_tls() -> None:
    """Every seed is kept, credentials and query ride on the first, rediss+ means TLS."""
    seeds = cluster_seeds("rediss+cluster://u:p%40w@a:7000,b:7001/0?socket_timeout=3")
    assert seeds.first_url == "rediss://u:p%40w@a:7000/0?socket_timeout=3"
    assert seeds.others == [("b", 7001)]
    assert cluster_seeds("redis+cluster://a:1?x=1").first_url == "redis://a:1/?x=1"
    assert is_cluster_url("REDIS+CLUSTER://a:1") and not is_cluster_url("redis://a:1")


@pytest.mark.parametrize(
    "url",
    ["redis+cluster://a", "redis+cluster://a:1,b", "redis+cluster://a:1/3", "redis+cluster://"],
)
def test_malformed_cluster_urls_are_refused(url: str) -> None:
    """A seed without a port, or a database other than 0, is a configuration error."""
    with pytest.raises(ConfigurationError):
        check_redis_url(url)


def test_cluster_url_password_is_masked() -> None:
    """The password of a cluster URL is masked like a redis:// one."""
    assert redacted_url("redis+cluster://u:secret@a:1,b:2") == "redis+cluster://u:***@a:1,b:2"


def test_cluster_url_connects_to_every_master(cluster: Cluster) -> None:
    """A ``redis+cluster://`` URL gives a cluster client that routes keys to their masters."""
    client = sync_client(cluster.url, socket_timeout=5)
    try:
        assert isinstance(client, redis.cluster.RedisCluster)
        assert len(client.get_primaries()) == 3
        for key in ("a", "b", "c", "d"):
            client.set(f"urltest:{key}", key)
            assert client.get(f"urltest:{key}") == key.encode()
        client.delete(*(f"urltest:{key}" for key in "abcd"))
    finally:
        client.close()


def test_tool_client_accepts_a_cluster_client_and_url(cluster: Cluster) -> None:
    """``ToolClient`` takes a ``RedisCluster`` as ``redis_client=`` and a cluster URL alike."""
    given = cluster.client()
    try:
        with ToolClient(redis_client=given, namespace="urltest") as client:
            assert client.tools() == []
            assert client.where.startswith("redis+cluster://127.0.0.1:")
        with ToolClient(cluster.url, namespace="urltest") as client:
            assert client.tools() == []
    finally:
        given.close()


#: A script on two keys of one slot: during that slot's migration, with one key present
#: and one absent, its master answers TRYAGAIN.
TWO_KEYS = "return redis.call('mget', KEYS[1], KEYS[2])"


def _migrating(cluster: Cluster, key: str) -> tuple[int, redis.Redis, redis.Redis]:
    """Open a migration of ``key``'s slot to another master: (slot, source, target)."""
    source_port = cluster.master_of(key)
    probe = cluster.client()
    try:
        slot = probe.keyslot(key)
        target_port = next(int(n.port) for n in probe.get_primaries() if n.port != source_port)
    finally:
        probe.close()
    source, target = redis.Redis(port=source_port), redis.Redis(port=target_port)
    source_id, target_id = source.cluster("myid"), target.cluster("myid")
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    return slot, source, target


def _stable(slot: int, *nodes: redis.Redis) -> None:
    for node in nodes:
        node.execute_command("CLUSTER", "SETSLOT", slot, "STABLE")
        node.close()


def test_tryagain_during_a_migration_is_retried_until_it_passes(cluster: Cluster) -> None:
    """A script on a slot under migration gets TRYAGAIN; redis-py alone gives up within a
    second, the client of ``sync_client`` retries with backoff and returns once the
    migration is over."""
    present, absent = "{urlmig}present", "{urlmig}absent"
    client = sync_client(cluster.url, socket_timeout=5)
    plain = cluster.client()
    try:
        client.set(present, "here")
        slot, source, target = _migrating(cluster, present)
        try:
            with pytest.raises(redis.exceptions.ClusterError):  # redis-py's own retries
                plain.eval(TWO_KEYS, 2, present, absent)
            ends = threading.Timer(1.5, _stable, (slot, source, target))
            started = time.monotonic()
            ends.start()
            assert client.eval(TWO_KEYS, 2, present, absent) == [b"here", None]
            assert time.monotonic() - started >= 1.4  # it waited for the migration's end
            ends.join()
        finally:
            _stable(slot, redis.Redis(port=source.connection_pool.connection_kwargs["port"]),
                    redis.Redis(port=target.connection_pool.connection_kwargs["port"]))  # fmt: skip
        client.delete(present)
    finally:
        client.close()
        plain.close()


def test_a_slot_that_stays_unavailable_raises_a_connection_error(cluster: Cluster) -> None:
    """Past its bounded retries the client raises ``ClusterUnavailableError``, a
    ``redis.ConnectionError`` (what callers handle as an unreachable Redis), within
    seconds."""
    present, absent = "{urlstuck}present", "{urlstuck}absent"
    client = sync_client(cluster.url, socket_timeout=5)
    try:
        client.set(present, "here")
        slot, source, target = _migrating(cluster, present)
        try:
            started = time.monotonic()
            with pytest.raises(ClusterUnavailableError) as caught:
                client.eval(TWO_KEYS, 2, present, absent)
            assert time.monotonic() - started < 30
            assert isinstance(caught.value, redis.ConnectionError)
            assert "TTL exhausted" in str(caught.value) or "TRYAGAIN" in str(caught.value)
        finally:
            _stable(slot, source, target)
        client.delete(present)
    finally:
        client.close()


def test_the_async_cluster_client_retries_tryagain_too(cluster: Cluster) -> None:
    """``async_client`` on a cluster URL retries a script on a slot under migration until
    the migration is over, like the sync client."""
    present, absent = "{urlasync}present", "{urlasync}absent"

    async def run() -> tuple[object, float]:
        client = async_client(cluster.url, socket_timeout=5)
        assert isinstance(client, AsyncRetryingCluster)
        try:
            await client.set(present, "here")
            slot, source, target = _migrating(cluster, present)
            ends = threading.Timer(1.5, _stable, (slot, source, target))
            started = time.monotonic()
            ends.start()
            try:
                reply = await client.eval(TWO_KEYS, 2, present, absent)
            finally:
                ends.join()
            took = time.monotonic() - started
            await client.delete(present)
            return reply, took
        finally:
            await client.aclose()

    reply, took = asyncio.run(run())
    assert reply == [b"here", None]
    assert took >= 1.4
