"""Both clients over ``unix://``, against a private redis-server that listens only there."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Fleet, start_fleet
from private_redis import start_unix_server
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared import Status

ADD = "ext_fleet_test_add"


@pytest.fixture(scope="module")
def unix_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """A redis-server on a private unix socket (no TCP port) and a fleet served through it."""
    folder = tmp_path_factory.mktemp("unix")
    server = start_unix_server(folder)
    try:
        ns = f"tftest-unix-{uuid.uuid4().hex[:6]}"
        fleet = start_fleet(server.url, ns, folder / "worker.log", processes=1, threads=4)
        try:
            yield fleet
        finally:
            fleet.stop()
    finally:
        server.stop()
        shutil.rmtree(Path(server.url.removeprefix("unix://")).parent, ignore_errors=True)


def test_async_client_calls_over_a_unix_socket(unix_fleet: Fleet) -> None:
    """AsyncToolClient("unix://...") answers calls ``ok`` (its reply connection takes no
    TCP-only option such as keepalive)."""

    async def run() -> list[object]:
        async with AsyncToolClient(unix_fleet.redis_url, namespace=unix_fleet.namespace) as c:
            return list(
                await asyncio.gather(
                    *(c.call(ADD, {"a": i, "b": 1}, timeout_s=20) for i in range(20))
                )
            )

    assert unix_fleet.redis_url.startswith("unix://")
    results = asyncio.run(run())
    assert [getattr(r, "status", None) for r in results] == [Status.OK] * 20
    assert [getattr(r, "content", None) for r in results] == [i + 1 for i in range(20)]


def test_sync_client_calls_over_a_unix_socket(unix_fleet: Fleet) -> None:
    """ToolClient("unix://...") answers calls ``ok``."""
    with ToolClient(unix_fleet.redis_url, namespace=unix_fleet.namespace) as client:
        result = client.call(ADD, {"a": 2, "b": 3}, timeout_s=20)
    assert result.status is Status.OK and result.content == 5
