"""What taking replies costs in Redis commands, counted on a private Redis (``MONITOR``,
``INFO commandstats``): one ``BLMPOP`` per wake-up of the reply listener, and ``BLPOP``
then ``LPOP`` where ``BLMPOP`` is refused."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import redis

from conftest import start_fleet
from private_redis import Server, TopLevelCommands, command_counts
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared import Status

ECHO = "ext_fleet_test_echo"
CALLS = 50


def _burst(client: ToolClient) -> list[Status]:
    futures = [client.submit(ECHO, {"text": str(i)}, timeout_s=60) for i in range(CALLS)]
    return [future.result().status for future in futures]


def _without_blmpop(url: str) -> redis.Redis:
    """An admin client of ``url``, after making the user ``replies`` (password ``secret``),
    who may run every command but ``BLMPOP``."""
    admin = redis.Redis.from_url(url)
    admin.acl_setuser(
        "replies", enabled=True, passwords=["+secret"], keys=["*"], channels=["*"],
        commands=["+@all", "-blmpop"],
    )  # fmt: skip
    return admin


def test_the_reply_listener_takes_replies_with_blmpop_alone(
    counting_server: Server, tmp_path: Path
) -> None:
    """50 calls in flight: their replies come by ``BLMPOP`` (up to 500 a command), never
    by ``BLPOP`` or ``LPOP``."""
    namespace = f"tfreply-{uuid.uuid4().hex[:6]}"
    admin = redis.Redis.from_url(counting_server.url)
    fleet = start_fleet(counting_server.url, namespace, tmp_path / "worker.log",
                        processes=1, threads=4)  # fmt: skip
    try:
        with ToolClient(counting_server.url, namespace=namespace) as client:
            assert client.call(ECHO, {"text": "warm"}, timeout_s=30).ok
            with TopLevelCommands(counting_server.url) as sent:
                statuses = _burst(client)
    finally:
        fleet.stop()
        admin.close()
    assert statuses == [Status.OK] * CALLS
    calls = sent.counts
    assert 1 <= calls.get("blmpop", 0) <= CALLS + 30, calls  # one per wake-up (and idle)
    assert "blpop" not in calls and "lpop" not in calls, calls


def test_a_client_not_allowed_blmpop_takes_replies_with_blpop_and_lpop(
    counting_server: Server, tmp_path: Path
) -> None:
    """A client whose ACL user may not run ``BLMPOP`` still gets every reply: the
    listener's first ``BLMPOP`` is refused, then it waits with ``BLPOP`` and drains with
    ``LPOP``."""
    namespace = f"tfreply-{uuid.uuid4().hex[:6]}"
    admin = _without_blmpop(counting_server.url)
    fleet = start_fleet(counting_server.url, namespace, tmp_path / "worker.log",
                        processes=1, threads=4)  # fmt: skip
    pool = redis.ConnectionPool.from_url(counting_server.url, username="replies",
                                         password="secret")  # fmt: skip
    try:
        admin.config_resetstat()
        with ToolClient(connection_pool=pool, namespace=namespace) as client:
            statuses = _burst(client)
            calls = command_counts(admin)
            stats = admin.info("commandstats")
    finally:
        fleet.stop()
        pool.disconnect()
        admin.close()
    assert statuses == [Status.OK] * CALLS
    assert calls.get("blpop", 0) >= 1
    refused = stats.get("cmdstat_blmpop", {})
    assert refused.get("calls", 0) == 0 and refused.get("rejected_calls", 0) == 1


def test_an_async_client_not_allowed_blmpop_takes_replies_with_blpop_and_lpop(
    counting_server: Server, tmp_path: Path
) -> None:
    """The same for an AsyncToolClient: every reply comes, by ``BLPOP`` and ``LPOP``."""
    namespace = f"tfreply-{uuid.uuid4().hex[:6]}"
    admin = _without_blmpop(counting_server.url)
    fleet = start_fleet(counting_server.url, namespace, tmp_path / "worker.log",
                        processes=1, threads=4)  # fmt: skip
    url = counting_server.url.replace("redis://", "redis://replies:secret@", 1)

    async def burst() -> list[Status]:
        async with AsyncToolClient(url, namespace=namespace) as client:
            futures = [
                await client.submit(ECHO, {"text": str(i)}, timeout_s=60) for i in range(CALLS)
            ]
            return [(await future).status for future in futures]

    try:
        admin.config_resetstat()
        statuses = asyncio.run(burst())
        calls = command_counts(admin)
        stats = admin.info("commandstats")
    finally:
        fleet.stop()
        admin.close()
    assert statuses == [Status.OK] * CALLS
    assert calls.get("blpop", 0) >= 1
    refused = stats.get("cmdstat_blmpop", {})
    assert refused.get("calls", 0) == 0 and refused.get("rejected_calls", 0) == 1
