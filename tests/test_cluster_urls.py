"""Cluster URLs: ``redis+cluster://`` seeds become a ``RedisCluster``, checked like any URL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import redis.cluster
from private_cluster import Cluster, start_cluster

from toolfleet.producer import ToolClient
from toolfleet.shared.connect import cluster_seeds, is_cluster_url, sync_client
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
