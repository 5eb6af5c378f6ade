"""What one refresh of the ops page costs Redis, and that open pages share one poller."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from conftest import Fleet, start_fleet
from private_redis import command_counts
from toolfleet.producer import ToolClient
from toolfleet.ui.poller import Poller
from toolfleet.ui.snapshot import read_snapshot

ECHO = "ext_fleet_test_echo"


@pytest.fixture
def counted_fleet(counting_server: Any, tmp_path: Any) -> Iterator[Fleet]:
    ns = f"uireads-{uuid.uuid4().hex[:6]}"
    running = start_fleet(counting_server.url, ns, tmp_path / "worker.log", processes=1,
                          threads=8)  # fmt: skip
    yield running
    running.stop()


def _frozen(fleet: Fleet, client: redis.Redis) -> list[int]:
    """Stop the fleet's processes (SIGSTOP) so that only the ui's reads reach Redis.

    Returns once Redis has run nothing for :data:`QUIET_S`: what a process sent just
    before it stopped (a heartbeat's pipeline) may still wait in Redis's input buffers,
    and on a loaded machine Redis may run it only after the first count began.
    """
    pids = [fleet.process.pid, *fleet.worker_pids()]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 30
    while True:
        client.config_resetstat()
        time.sleep(QUIET_S)
        late = command_counts(client)
        if not late:
            return pids
        if time.monotonic() > deadline:
            _thaw(pids)
            raise AssertionError(f"Redis still runs commands of the frozen fleet: {late}")


#: seconds without a command after which the frozen fleet has nothing left in Redis's buffers
QUIET_S = 0.5


def _thaw(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def _one_refresh(client: redis.Redis, namespace: str) -> dict[str, int]:
    """The commands of one steady-state snapshot (after the one that loads the script)."""
    read_snapshot(client, namespace, worker_ttl_s=3600)
    client.config_resetstat()
    snapshot = read_snapshot(client, namespace, worker_ttl_s=3600)
    counts = command_counts(client)
    assert snapshot.catalog, "the fleet's catalog is read"
    return counts


def test_a_refresh_costs_the_same_commands_after_10_and_after_2000_calls(
    counted_fleet: Fleet,
) -> None:
    """The commands of one snapshot do not grow with the calls the fleet ran."""
    client = redis.Redis.from_url(counted_fleet.redis_url)
    ns = counted_fleet.namespace
    # Each refresh is counted with no client open: a client's reply listener sends its
    # BLPOP on its own schedule, and the fleet is frozen, so only the ui's reads count.
    with ToolClient(counted_fleet.redis_url, namespace=ns) as calls:
        assert all(calls.call(ECHO, {"text": "x"}).ok for _ in range(10))
    asyncio.run(asyncio.sleep(1.5))  # a heartbeat adds them to the aggregates
    pids = _frozen(counted_fleet, client)
    try:
        after_10 = _one_refresh(client, ns)
    finally:
        _thaw(pids)
    with ToolClient(counted_fleet.redis_url, namespace=ns) as calls:
        futures = [calls.submit(ECHO, {"text": "y"}) for _ in range(2000)]
        assert all(f.result(timeout=120).ok for f in futures)
    asyncio.run(asyncio.sleep(1.5))
    pids = _frozen(counted_fleet, client)
    try:
        after_2010 = _one_refresh(client, ns)
        snapshot = read_snapshot(client, ns, worker_ttl_s=3600)
    finally:
        _thaw(pids)
    assert snapshot.tool(ECHO) is not None and snapshot.tool(ECHO).total == 2010  # type: ignore[union-attr]
    assert after_10 == after_2010
    print("commands per refresh:", sum(after_10.values()), sorted(after_10.items()))
    assert "scan" not in after_10 and "keys" not in after_10


def test_open_pages_share_one_poller() -> None:
    """Ten live streams on one poller cause one read per new snapshot, not one per stream."""
    reads: list[int] = []

    def read() -> Any:
        reads.append(1)
        return object()

    async def main() -> list[int]:
        poller = Poller(read, interval_s=0.05)
        got = [0] * 10

        async def watch(i: int) -> None:
            async for _ in poller.updates():
                got[i] += 1
                if got[i] == 5:
                    return

        await asyncio.gather(*(watch(i) for i in range(10)))
        await poller.close()
        return got

    got = asyncio.run(main())
    assert got == [5] * 10
    assert 5 <= len(reads) <= 7  # each stream saw 5 snapshots; one poller read about 5
