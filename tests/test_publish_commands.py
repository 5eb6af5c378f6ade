"""What a publish costs in Redis commands, counted by a private Redis's ``INFO commandstats``."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import redis

from conftest import start_fleet
from private_redis import Server, command_counts
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.producer.publish import Publisher
from toolfleet.shared import Status
from toolfleet.shared.naming import limits_key
from toolfleet.shared.wire import CallContext, ToolCallRequest

QUEUE = "tools.counted"
FUNCTION = "ext_counted_tool"
ECHO = "ext_fleet_test_echo"


def _request(account: str | None = None) -> ToolCallRequest:
    now = time.time()
    return ToolCallRequest(
        id=str(uuid.uuid4()),
        function=FUNCTION,
        arguments={"a": 1},
        reply_to="nowhere",
        deadline=now + 30,
        timeout_s=30.0,
        sent_at=now,
        context=CallContext(account=account),
    )


def test_a_batch_publish_sends_evalsha_alone_and_reads_no_breaker_of_a_tool_without_one(
    counting_server: Server,
) -> None:
    """10 publishes at once: one ``EVALSHA`` of the batch script, no ``SCRIPT EXISTS``, no
    breaker read, and each call enqueued as if alone."""
    client = redis.Redis.from_url(counting_server.url)
    try:
        publisher = Publisher(client, "tfcount")
        publisher.publish_many([(QUEUE, _request())], no_breaker={FUNCTION})  # loads the script
        client.config_resetstat()
        items = [(f"{QUEUE}-{i}", _request()) for i in range(10)]  # empty lanes
        outcomes = publisher.publish_many(items, no_breaker={FUNCTION})
        calls = command_counts(client)
    finally:
        client.close()
    assert outcomes == [None] * 10
    # rpush: the id on its lane, the token, and the lane's number on the lane rotation
    assert calls == {"evalsha": 1, "hset": 10, "llen": 10, "rpush": 30}


def test_an_account_s_quota_scopes_are_read_in_one_hmget_and_still_enforced(
    counting_server: Server,
) -> None:
    """An account's quota fields are one ``HMGET``; a quota set just before applies at once."""
    client = redis.Redis.from_url(counting_server.url)
    try:
        publisher = Publisher(client, "tfcount")
        assert publisher.publish(QUEUE, _request("acme")) is None
        client.hset(limits_key("tfcount"), "acme", '{"in_flight": 1}')
        client.config_resetstat()
        first = publisher.publish(QUEUE, _request("acme"))
        second = publisher.publish(QUEUE, _request("acme"))
        calls = command_counts(client)
    finally:
        client.close()
    assert first is None
    assert second is not None and second.reason == "in_flight"
    # per run: the quota fields, the breaker; the full scope's call runs twice, the second
    # time with the outcome key of the call holding the scope (one EXISTS)
    assert calls.get("hmget") == 6
    assert calls.get("evalsha") == 3 and calls.get("exists") == 1
    assert "hget" not in calls


def test_a_flushed_script_is_loaded_again_and_calls_still_succeed(
    counting_server: Server, tmp_path: Path
) -> None:
    """Calls send no ``SCRIPT EXISTS``; after ``SCRIPT FLUSH`` the script is loaded, calls ok."""
    ns = f"tfcount-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(counting_server.url, ns, tmp_path / "fleet.log", processes=1, threads=2)
    admin = redis.Redis.from_url(counting_server.url)
    try:
        with ToolClient(counting_server.url, namespace=ns) as client:
            assert client.call(ECHO, {"text": "warm"}).status is Status.OK
            admin.config_resetstat()
            for i in range(5):
                assert client.call(ECHO, {"text": str(i)}).status is Status.OK
            steady = command_counts(admin)
            admin.script_flush()
            admin.config_resetstat()
            assert client.call(ECHO, {"text": "again"}).status is Status.OK
            sync_flushed = command_counts(admin)

        async def main() -> tuple[Status, dict[str, int], dict[str, int]]:
            async with AsyncToolClient(counting_server.url, namespace=ns) as aclient:
                assert (await aclient.call(ECHO, {"text": "warm"})).status is Status.OK
                admin.config_resetstat()
                await asyncio.gather(*(aclient.call(ECHO, {"text": str(i)}) for i in range(5)))
                async_steady = command_counts(admin)
                admin.script_flush()
                admin.config_resetstat()
                result = await aclient.call(ECHO, {"text": "after flush"})
                return result.status, async_steady, command_counts(admin)

        async_status, async_steady, async_flushed = asyncio.run(main())
    finally:
        admin.close()
        fleet.stop()
    for calls in (steady, async_steady):
        assert not any(name.startswith("script") for name in calls), calls
    assert async_status is Status.OK
    for calls in (sync_flushed, async_flushed):
        assert "script|exists" not in calls, calls
        assert calls.get("script|load", 0) >= 1, calls  # the producer's and the worker's


def _reply_pops(url: str, ns: str, calls: Callable[[], None]) -> dict[str, int]:
    """``BLMPOP``, ``BLPOP`` and ``LPOP`` on reply lists of ``ns`` while ``calls`` runs
    (``MONITOR``)."""
    seen = {"blmpop": 0, "blpop": 0, "lpop": 0}
    ready, stop = threading.Event(), threading.Event()

    def watch() -> None:
        watcher = redis.Redis.from_url(url)
        with watcher.monitor() as monitor:
            ready.set()
            while not stop.is_set():
                parts = str(monitor.next_command()["command"]).split()
                name = parts[0].lower() if parts else ""
                at = 3 if name == "blmpop" else 1  # BLMPOP timeout numkeys key ...
                key = parts[at] if len(parts) > at else ""
                if name in seen and key.startswith(f"{ns}:reply:"):
                    seen[name] += 1
        watcher.close()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert ready.wait(5)
    calls()
    stop.set()
    waker = redis.Redis.from_url(url)
    while thread.is_alive():
        waker.ping()
        thread.join(0.05)
    waker.close()
    return seen


def test_a_lone_call_s_reply_costs_one_pop(counting_server: Server, tmp_path: Path) -> None:
    """A reply costs the reply listener one command: a ``BLMPOP`` (that takes whatever
    else came with it), never a ``BLPOP`` and a drain after it."""
    ns = f"tfcount-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(counting_server.url, ns, tmp_path / "fleet.log", processes=1, threads=2)
    try:
        with ToolClient(counting_server.url, namespace=ns) as client:
            assert client.call(ECHO, {"text": "warm"}).status is Status.OK

            def sequential() -> None:
                for i in range(5):
                    assert client.call(ECHO, {"text": str(i)}).status is Status.OK

            sync = _reply_pops(counting_server.url, ns, sequential)

        async def main() -> None:
            async with AsyncToolClient(counting_server.url, namespace=ns) as aclient:
                assert (await aclient.call(ECHO, {"text": "warm"})).status is Status.OK
                for i in range(5):
                    assert (await aclient.call(ECHO, {"text": str(i)})).status is Status.OK

        asynchronous = _reply_pops(counting_server.url, ns, lambda: asyncio.run(main()))
    finally:
        fleet.stop()
    # 5 replies, each taken by a BLMPOP (the first may have been waiting before MONITOR began)
    for pops in (sync, asynchronous):
        assert pops["lpop"] == 0 and pops["blpop"] == 0 and pops["blmpop"] >= 4, pops


def test_an_idempotency_key_costs_one_get_and_one_set_and_a_duplicate_publishes_nothing(
    counting_server: Server,
) -> None:
    """With a key: one ``GET`` of its record and one ``SET`` when published; the same call
    again: the ``GET`` only, answered with the first call's id; another call: refused."""
    from toolfleet.shared.idempotency import Duplicate, Idempotency, fingerprint
    from toolfleet.shared.naming import idempotency_key

    client = redis.Redis.from_url(counting_server.url)
    try:
        publisher = Publisher(client, "tfcount")
        publisher.publish_many([(QUEUE, _request())], no_breaker={FUNCTION})  # loads the script
        first, again, other = _request(), _request(), _request()
        other.arguments = {"a": 2}
        record = idempotency_key("tfcount", None, "k")
        keys = {r.id: Idempotency("k", record, fingerprint(r.function, r.arguments))
                for r in (first, again, other)}  # fmt: skip
        client.config_resetstat()
        outcomes = publisher.publish_many([(f"{QUEUE}-k", first)], {FUNCTION}, keys)
        published = command_counts(client)
        client.config_resetstat()
        duplicates = publisher.publish_many(
            [(f"{QUEUE}-k", again), (f"{QUEUE}-k", other)], {FUNCTION}, keys
        )
        refused = command_counts(client)
        held = client.get(record)
    finally:
        client.close()
    assert outcomes == [None]
    assert published == {"evalsha": 1, "get": 1, "set": 1, "hset": 1, "llen": 1, "rpush": 3}
    assert duplicates == [Duplicate(first.id, misuse=False), Duplicate(first.id, misuse=True)]
    assert refused == {"evalsha": 1, "get": 2}  # both in one run of the batch script
    assert held is not None and held.decode().endswith(first.id)
