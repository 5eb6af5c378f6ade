"""A ready-made Redis client (Sentinel) for both producers and the worker, against a real
sentinel monitoring a private redis-server, both on private loopback ports."""

from __future__ import annotations

import asyncio
import os
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import redis.asyncio
import redis.asyncio.sentinel
from redis.sentinel import Sentinel

from conftest import TESTS, Fleet, start_fleet, toolfleet_command
from private_redis import Server, free_port, start_server, start_tcp_server
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared import Status

ECHO = "ext_fleet_test_echo"
SERVICE = "tfmaster"


@dataclass
class SentinelSetup:
    """A private master and a sentinel monitoring it."""

    master: Server
    sentinel: Server
    sentinel_port: int

    def env(self) -> dict[str, str]:
        return {"TFTEST_SENTINEL_PORT": str(self.sentinel_port), "TFTEST_SENTINEL_SERVICE": SERVICE}


@pytest.fixture(scope="module")
def sentinel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelSetup]:
    """A redis-server and a ``redis-server --sentinel`` watching it, on free loopback ports."""
    folder = tmp_path_factory.mktemp("sentinel")
    master = start_tcp_server(folder)
    master_port = int(master.url.rsplit(":", 1)[1].split("/")[0])
    port = free_port()
    config = folder / "sentinel.conf"
    config.write_text(
        f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
        f"sentinel monitor {SERVICE} 127.0.0.1 {master_port} 1\n"
        f"sentinel down-after-milliseconds {SERVICE} 60000\n"
    )
    try:
        watcher = start_server(
            folder, [str(config), "--sentinel"], f"redis://127.0.0.1:{port}/0", name="sentinel"
        )
    except BaseException:
        master.stop()
        raise
    try:
        found = Sentinel([("127.0.0.1", port)]).discover_master(SERVICE)
        assert found == ("127.0.0.1", master_port)
        yield SentinelSetup(master, watcher, port)
    finally:
        watcher.stop()
        master.stop()


@pytest.fixture(scope="module")
def sentinel_fleet(
    sentinel: SentinelSetup, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """``toolfleet worker --redis-client sentinel_factory:master`` with no Redis URL at all."""
    ns = f"tftest-sentinel-{uuid.uuid4().hex[:6]}"
    folder = tmp_path_factory.mktemp("sentinel-fleet")
    log = folder / "worker.log"
    fleet = start_fleet(
        sentinel.master.url,  # only for the test's own readiness checks
        ns,
        log,
        processes=1,
        threads=4,
        extra=["--redis-client", "sentinel_factory:master"],
        env={
            "TOOLFLEET_REDIS_URL": "",
            "TOOLFLEET_HEALTH_DIR": str(folder / "health"),
            **sentinel.env(),
        },
    )
    yield fleet
    fleet.stop()


def test_worker_and_sync_producer_work_through_sentinel(
    sentinel: SentinelSetup, sentinel_fleet: Fleet
) -> None:
    """A worker given only a Sentinel factory serves calls that a ToolClient built on
    ``Sentinel(...).master_for(...)`` makes and lists."""
    client_of_sentinel = Sentinel([("127.0.0.1", sentinel.sentinel_port)]).master_for(SERVICE)
    with ToolClient(redis_client=client_of_sentinel, namespace=sentinel_fleet.namespace) as c:
        names = [t["function"]["name"] for t in c.tools()]
        result = c.call(ECHO, {"text": "via sentinel"}, context={"account": "a"}, timeout_s=20)
    assert ECHO in names
    assert result.status is Status.OK, result
    assert result.content == {"text": "via sentinel", "account": "a"}
    assert client_of_sentinel.ping()  # the caller's client is left open


def test_async_producer_works_through_sentinel(
    sentinel: SentinelSetup, sentinel_fleet: Fleet
) -> None:
    """An AsyncToolClient built on ``redis.asyncio`` Sentinel's ``master_for`` gets answers."""

    async def run() -> list[object]:
        watcher = redis.asyncio.sentinel.Sentinel([("127.0.0.1", sentinel.sentinel_port)])
        master = watcher.master_for(SERVICE)
        async with AsyncToolClient(redis_client=master, namespace=sentinel_fleet.namespace) as c:
            results = await asyncio.gather(
                *(c.call(ECHO, {"text": str(i)}, timeout_s=20) for i in range(10))
            )
        await master.aclose()
        return list(results)

    results = asyncio.run(run())
    assert [getattr(r, "content", None) for r in results] == [
        {"text": str(i), "account": None} for i in range(10)
    ]


def test_sync_producer_on_a_connection_pool(sentinel: SentinelSetup, sentinel_fleet: Fleet) -> None:
    """ToolClient(connection_pool=...) uses the caller's pool and leaves it open."""
    pool = redis.ConnectionPool.from_url(sentinel.master.url)
    with ToolClient(connection_pool=pool, namespace=sentinel_fleet.namespace) as client:
        result = client.call(ECHO, {"text": "pool"}, timeout_s=20)
    assert result.status is Status.OK
    assert redis.Redis(connection_pool=pool).ping()
    pool.disconnect()


def test_health_ready_pings_through_the_factory(
    sentinel: SentinelSetup, sentinel_fleet: Fleet
) -> None:
    """``toolfleet health --ready`` with only TOOLFLEET_REDIS_CLIENT set reaches Redis
    through the factory and reports ready."""
    env = {
        **os.environ,
        **sentinel.env(),
        "PYTHONPATH": str(TESTS),
        "TOOLFLEET_REDIS_URL": "",
        "TOOLFLEET_REDIS_CLIENT": "sentinel_factory:master",
        "TOOLFLEET_HEALTH_DIR": str(sentinel_fleet.log_path.parent / "health"),
    }
    done = subprocess.run(
        [toolfleet_command(), "health", "--ready"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Redis reachable" in done.stdout + done.stderr


def test_worker_with_a_broken_factory_says_so(tmp_path: Path) -> None:
    """``toolfleet worker --redis-client`` naming a missing factory exits non-zero naming it."""
    env = {**os.environ, "TOOLFLEET_REDIS_URL": "", "TOOLFLEET_METRICS_PORT": "0"}
    done = subprocess.run(
        [toolfleet_command(), "worker", "-p", "1", "--redis-client", "no_such_module_x:make"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "no_such_module_x" in done.stderr + done.stdout


def test_worker_refuses_a_sentinel_url_pointing_to_the_factory() -> None:
    """``toolfleet worker`` given a ``redis+sentinel://`` URL exits non-zero, saying to use
    ``--redis-client`` and without printing the password."""
    env = {
        **os.environ,
        "TOOLFLEET_REDIS_URL": "redis+sentinel://:pw-secret@127.0.0.1:26379/mymaster",
        "TOOLFLEET_METRICS_PORT": "0",
    }
    done = subprocess.run(
        [toolfleet_command(), "worker", "-p", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert "--redis-client" in output
    assert "pw-secret" not in output
