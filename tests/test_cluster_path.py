"""The whole path through ``redis+cluster://``: the async client, idempotency keys, the CLI.

A real 3-master loopback cluster with two queue groups on two masters (the module fleet
of :func:`private_cluster.cluster_fleet`); no mock of Redis, Dramatiq or the CLI.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
from private_cluster import ClusterFleet, cluster_fleet

from conftest import toolfleet_command
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared.wire import Status

F = "ext_fleet_test_"
FACTORIAL = "ext_bfcl_math_factorial"
#: n! for n = 0..14, written out (not computed by the code under test).
FACTORIALS = [1, 1, 2, 6, 24, 120, 720, 5040, 40320, 362880, 3628800, 39916800,
              479001600, 6227020800, 87178291200]  # fmt: skip


@pytest.fixture(scope="module")
def cfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFleet]:
    with cluster_fleet(tmp_path_factory.mktemp("cpath")) as fleet:
        yield fleet


def _turn() -> list[dict[str, Any]]:
    return [
        {"id": "c1", "type": "function",
         "function": {"name": F + "add", "arguments": '{"a": 40, "b": 2}'}},
        {"id": "c2", "type": "function",
         "function": {"name": FACTORIAL, "arguments": '{"n": 10}'}},
    ]  # fmt: skip


def _reply_lists_empty(cfleet: ClusterFleet, client_id: str) -> None:
    """No reply is left on the client's reply list of either group (a second reply would be)."""
    client = cfleet.cluster.client()
    try:
        for group in (cfleet.test_group, cfleet.bfcl_group):
            key = f"{cfleet.prefix(group)}:reply:{client_id}"
            assert client.llen(key) == 0, key
    finally:
        client.close()


# -- the async client ---------------------------------------------------------------------


def test_async_client_calls_both_groups_on_a_cluster_url(cfleet: ClusterFleet) -> None:
    """``AsyncToolClient(redis+cluster://...)``: calls on two masters, a turn, once each."""

    async def main() -> tuple[list[Any], list[Any], list[dict[str, Any]], str]:
        async with AsyncToolClient(cfleet.url, namespace=cfleet.namespace) as client:
            adds = [client.call(F + "add", {"a": i, "b": 1000}, timeout_s=60) for i in range(60)]
            facts = [client.call(FACTORIAL, {"n": i % 15}, timeout_s=60) for i in range(60)]
            results = await asyncio.gather(*adds, *facts)
            messages = await client.dispatch(_turn(), timeout_s=30)
            await asyncio.sleep(0.5)  # a second reply to any call would be listed by now
            _reply_lists_empty(cfleet, client.client_id)
            return list(results[:60]), list(results[60:]), messages, client.client_id

    adds, facts, messages, _ = asyncio.run(main())
    assert [r.content for r in adds] == [i + 1000 for i in range(60)]
    assert [r.content for r in facts] == [FACTORIALS[i % 15] for i in range(60)]
    assert [m["tool_call_id"] for m in messages] == ["c1", "c2"]
    assert [m["content"] for m in messages] == ["42", "3628800"]


def test_async_client_on_a_given_cluster_client(cfleet: ClusterFleet) -> None:
    """``redis_client=`` a ``redis.asyncio.cluster.RedisCluster``: served, and left open."""

    async def main() -> tuple[Any, Any, Any]:
        given = redis.asyncio.cluster.RedisCluster.from_url(
            f"redis://127.0.0.1:{cfleet.cluster.ports[0]}"
        )
        try:
            async with AsyncToolClient(redis_client=given, namespace=cfleet.namespace) as client:
                add = await client.call(F + "add", {"a": 5, "b": 6}, timeout_s=30)
                fact = await client.call(FACTORIAL, {"n": 6}, timeout_s=30)
            pong = await given.incr("still-open{x}")  # the caller's client is the caller's
            return add, fact, pong
        finally:
            await given.aclose()

    add, fact, pong = asyncio.run(main())
    assert (add.status, add.content) == (Status.OK, 11)
    assert (fact.status, fact.content) == (Status.OK, 720)
    assert pong == 1


def test_async_stream_and_cancel_on_a_cluster(cfleet: ClusterFleet) -> None:
    """A streamed turn across groups ends with each call's result; a queued call cancels."""

    async def main() -> tuple[list[str], list[dict[str, Any]], Any, list[Any]]:
        async with AsyncToolClient(cfleet.url, namespace=cfleet.namespace) as client:
            kinds: list[str] = []
            async with client.stream(_turn(), timeout_s=30) as events:
                async for event in events:
                    kinds.append(event.kind)
            messages = events.messages
            # two busy threads on the test group: a third call waits queued
            blockers = [
                await client.submit(F + "sleep", {"seconds": 0.8}, timeout_s=30) for _ in range(2)
            ]
            await asyncio.sleep(0.3)
            queued = await client.submit(F + "add", {"a": 1, "b": 1}, timeout_s=30)
            assert await client.cancel(queued.call_id)
            canceled = await queued
            done = [await b for b in blockers]
            return kinds, messages, canceled, done

    kinds, messages, canceled, done = asyncio.run(main())
    assert kinds.count("result") == 2, kinds
    assert [m["content"] for m in messages] == ["42", "3628800"]
    assert canceled.status is Status.CANCELED
    assert [d.status for d in done] == [Status.OK, Status.OK]


# -- keys in the group's slot -------------------------------------------------------------


def _record_key(prefix: str, account: str | None, key: str, index: int | None) -> str:
    """The documented idempotency record name, built here from docs/cluster.md's layout."""
    text = json.dumps([account, key, index], ensure_ascii=True, separators=(",", ":"))
    return f"{prefix}:idempotency:{hashlib.sha256(text.encode('ascii')).hexdigest()}"


def test_an_idempotency_key_on_a_cluster_runs_the_call_once(cfleet: ClusterFleet) -> None:
    """The same key twice: one run, the second answered with the first's outcome; the record
    lives on the master of the call's group."""
    key = f"order-{time.time_ns()}"
    with ToolClient(cfleet.url, namespace=cfleet.namespace) as client:
        first = client.call(FACTORIAL, {"n": 7}, idempotency_key=key, timeout_s=30)
        second = client.call(FACTORIAL, {"n": 7}, idempotency_key=key, timeout_s=30)
    assert (first.status, first.content) == (Status.OK, 5040)
    assert (second.status, second.content) == (Status.OK, 5040)
    assert second.duplicate_of == first.id
    record = _record_key(cfleet.prefix(cfleet.bfcl_group), None, key, None)
    node = redis.Redis(port=cfleet.cluster.master_of(record))
    try:
        assert node.exists(record) == 1  # a plain client: the key is on this very node
    finally:
        node.close()
    assert cfleet.cluster.master_of(record) == cfleet.cluster.master_of(
        f"{cfleet.prefix(cfleet.bfcl_group)}:x"
    )


def test_an_async_idempotency_key_on_a_cluster(cfleet: ClusterFleet) -> None:
    """The async client's duplicate also waits for, and gets, the first call's outcome."""
    key = f"async-order-{time.time_ns()}"

    async def main() -> tuple[Any, Any]:
        async with AsyncToolClient(cfleet.url, namespace=cfleet.namespace) as client:
            first = await client.submit(F + "sleep", {"seconds": 0.5}, idempotency_key=key)
            second = await client.submit(F + "sleep", {"seconds": 0.5}, idempotency_key=key)
            return await first, await second

    first, second = asyncio.run(main())
    assert first.status is Status.OK and second.status is Status.OK
    assert second.duplicate_of == first.id


# -- the CLI ------------------------------------------------------------------------------


def _cli(cfleet: ClusterFleet, *args: str, timeout_s: float = 60) -> str:
    done = subprocess.run([toolfleet_command(), *args], env=cfleet.env(), capture_output=True,
                          text=True, timeout=timeout_s, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
