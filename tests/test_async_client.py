"""AsyncToolClient on redis.asyncio, clients shared by many tasks and threads, backpressure.

What stays one client's here is its own: the async client's connection pool and memory per
call, tasks sharing it, task cancellation and its event-loop binding; threads sharing the sync
client. Listing the catalog and the frozen-Redis deadline run with both clients (through
:class:`conftest.Either`).
"""

from __future__ import annotations

import asyncio
import gc
import math
import os
import signal
import threading
import time
import tracemalloc
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
import redis.asyncio

from conftest import IDLE, IDLE_QUEUE, LATE_S, Either, Fleet
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.producer.async_client import COMMAND_CONNECTIONS
from toolfleet.shared import ClientError, Status, codec
from toolfleet.shared.naming import cancel_key, catalog_key, outcome_key, workers_key

F = "ext_fleet_test_"
FACTORIAL = "ext_bfcl_math_factorial"


async def _connections(sampler: redis.asyncio.Redis, client_id: str) -> int:
    """Redis connections whose client name carries ``client_id``."""
    return sum(1 for c in await sampler.client_list() if client_id in (c.get("name") or ""))


def test_ten_thousand_calls_in_flight_resolve_on_constant_connections(fleet: Fleet) -> None:
    """10,000 concurrent calls through 2 worker processes all resolve correctly, on 1 reply
    connection and a command pool that does not grow."""

    async def run() -> tuple[list[Any], list[int], int]:
        sampler = redis.asyncio.Redis.from_url(fleet.redis_url)
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            counts: list[int] = []
            peak = 0

            async def sample() -> None:
                nonlocal peak
                while True:
                    counts.append(await _connections(sampler, client.client_id))
                    peak = max(peak, client.in_flight)
                    await asyncio.sleep(0.05)

            watcher = asyncio.create_task(sample())
            futures = await asyncio.gather(
                *(
                    client.submit(F + "add", {"a": i, "b": 10**20}, timeout_s=240)
                    for i in range(10_000)
                )
            )
            peak = max(peak, client.in_flight)
            results = await asyncio.wait_for(asyncio.gather(*futures), 250)
            counts.append(await _connections(sampler, client.client_id))
            watcher.cancel()
        await sampler.aclose()
        return results, counts, peak

    started, cpu = time.monotonic(), time.process_time()
    results, counts, peak = asyncio.run(run())
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    assert [r.status for r in results] == [Status.OK] * 10_000
    assert [r.content for r in results] == [i + 10**20 for i in range(10_000)]
    assert len({r.id for r in results}) == 10_000
    assert peak >= 5_000, peak  # the burst really was in flight at once
    opened = max(counts)
    assert 2 <= opened <= 1 + COMMAND_CONNECTIONS, counts
    assert set(counts[counts.index(opened) :]) == {opened}, counts  # constant once opened
    print(
        f"\n10,000 calls: {elapsed:.1f} s (client CPU {cpu:.1f} s), peak in flight {peak}, "
        f"connections {max(counts)}"
    )


def test_memory_per_call_held_in_flight(redis_url: str, idle_namespace: str) -> None:
    """Calls held in flight (their queue is not consumed) cost about 1 KiB each in the client,
    on one reply connection; close(wait=False) resolves every one of them timeout."""
    count = 1_000

    async def run() -> tuple[float, int, list[Any]]:
        sampler = redis.asyncio.Redis.from_url(redis_url)
        client = AsyncToolClient(redis_url, namespace=idle_namespace)
        futures = [await client.submit(IDLE, {"x": -1}, timeout_s=60)]  # connections, catalog
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):  # one by one: no gather bookkeeping in the figure
            futures.append(await client.submit(IDLE, {"x": i}, timeout_s=60))
        gc.collect()
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert client.in_flight == count + 1
        connections = await _connections(sampler, client.client_id)
        await client.close(wait=False)
        await sampler.aclose()
        return held / count, connections, futures

    per_call, connections, futures = asyncio.run(run())
    assert all(f.result().status is Status.TIMEOUT for f in futures)
    assert "closed" in futures[-1].result().error
    assert 2 <= connections <= 1 + COMMAND_CONNECTIONS
    assert per_call < 4096, per_call
    print(f"\nclient memory per in-flight call: {per_call:.0f} bytes; connections {connections}")


def test_five_hundred_tasks_share_one_async_client(fleet: Fleet) -> None:
    """500 concurrent tasks on one AsyncToolClient each get their own exact factorial."""

    async def one(client: AsyncToolClient, n: int) -> tuple[int, Any]:
        result = await client.call(FACTORIAL, {"n": n}, tool_call_id=f"task-{n}", timeout_s=20)
        return n, result

    async def run() -> list[tuple[int, Any]]:
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            return await asyncio.wait_for(asyncio.gather(*(one(client, n) for n in range(500))), 30)

    for n, result in asyncio.run(run()):
        assert result.status is Status.OK, result
        assert result.tool_call_id == f"task-{n}"
        assert result.content == math.factorial(n)


def test_sixty_four_threads_share_one_sync_client(client: ToolClient) -> None:
    """64 threads on one ToolClient, 5 calls each, each get their own exact factorial."""
    outcomes: dict[int, Any] = {}
    lock = threading.Lock()

    def worker(thread: int) -> None:
        for k in range(5):
            n = thread * 5 + k
            result = client.call(FACTORIAL, {"n": n}, tool_call_id=f"t{n}", timeout_s=20)
            with lock:
                outcomes[n] = result

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(outcomes) == list(range(320))
    for n, result in outcomes.items():
        assert result.status is Status.OK and result.tool_call_id == f"t{n}"
        assert result.content == math.factorial(n)


def test_canceling_the_awaiting_task_cancels_the_call(fleet: Fleet) -> None:
    """Canceling a task awaiting call() cancels the call: it never completes in the fleet."""

    async def run() -> None:
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            task = asyncio.create_task(client.call(F + "slow", {"seconds": 5}, timeout_s=10))
            await asyncio.sleep(0.3)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert client.in_flight == 0
            future = await client.submit(F + "slow", {"seconds": 5}, timeout_s=10)
            assert await client.cancel(future.call_id) is True
            assert (await future).status is Status.CANCELED
            assert await client.cancel(future.call_id) is False

    asyncio.run(run())


def test_canceling_the_task_while_its_call_is_being_published_cancels_the_call(
    fleet: Fleet,
) -> None:
    """A task canceled while its call() is being published (the call is registered, the
    publish still in flight) cancels the call in the fleet: its cancel marker is written and
    it never completes."""
    r = redis.Redis.from_url(fleet.redis_url)
    pattern = cancel_key(fleet.namespace, "*")
    before = set(r.scan_iter(match=pattern))

    async def run() -> set[bytes]:
        async with AsyncToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            await client.tools()  # the catalog is cached: call() goes straight to publishing
            task = asyncio.create_task(client.call(F + "slow", {"seconds": 3}, timeout_s=10))
            for _ in range(100):
                await asyncio.sleep(0)
                if client.in_flight:
                    break
            assert client.in_flight == 1 and not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            deadline = time.monotonic() + 2
            while not set(r.scan_iter(match=pattern)) - before:
                assert time.monotonic() < deadline, "the call was not canceled in the fleet"
                await asyncio.sleep(0.05)
            assert client.in_flight == 0
            return set(r.scan_iter(match=pattern)) - before

    try:
        (marker,) = asyncio.run(run())
        call_id = marker.decode().rpartition(":")[2]
        time.sleep(3.5)  # the tool would have finished by now
        outcome = r.get(outcome_key(fleet.namespace, call_id))
        assert outcome is None or b'"canceled"' in outcome, outcome
    finally:
        r.close()


def test_a_client_is_bound_to_its_event_loop(fleet: Fleet) -> None:
    """Using an AsyncToolClient from a second event loop is a ClientError, not a hang."""
    client = AsyncToolClient(fleet.redis_url, namespace=fleet.namespace)

    async def first() -> None:
        assert (await client.call(F + "add", {"a": 1, "b": 1})).content == 2

    async def second() -> None:
        with pytest.raises(ClientError, match="event loop"):
            await client.call(F + "add", {"a": 1, "b": 1})

    asyncio.run(first())
    asyncio.run(second())


def test_tools_lists_the_catalog(either: Either) -> None:
    """tools() returns the fleet's tools in the requested format."""
    names = {t["name"] for t in either.tools(format="anthropic")}
    assert {F + "add", FACTORIAL} <= names


def test_a_frozen_redis_never_holds_a_caller_past_its_deadline(kind: str) -> None:
    """With Redis frozen (SIGSTOP), concurrent calls and a whole turn still return by their
    deadline (well before the 2 s ``redis_timeout_s``), answered timeout or not_available."""
    from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis

    with EmbeddedRedis() as server:
        ns = f"tffrozen-{uuid.uuid4().hex[:6]}"
        r = redis.Redis.from_url(server.url)
        entry = {"name": IDLE, "description": "x", "parameters": {}, "queue": IDLE_QUEUE}
        r.hset(catalog_key(ns), IDLE, codec.dumps(entry))
        r.zadd(workers_key(ns, IDLE_QUEUE), {"test:0": time.time() + 3600})
        pid = server._process.pid  # type: ignore[union-attr]
        turn = [
            {"id": f"c{i}", "type": "function", "function": {"name": IDLE, "arguments": "{}"}}
            for i in range(3)
        ]
        client = Either(kind, server.url, namespace=ns)
        try:
            client.call(IDLE, {}, timeout_s=0.2)  # connections and catalog are warm
            os.kill(pid, signal.SIGSTOP)
            try:
                started = time.monotonic()
                with ThreadPoolExecutor(21) as pool:
                    calls = [
                        pool.submit(client.call, IDLE, {"x": i}, timeout_s=1) for i in range(20)
                    ]
                    turned = pool.submit(client.dispatch, turn, timeout_s=1)
                    results = [c.result() for c in calls]
                    messages = turned.result()
                elapsed = time.monotonic() - started
            finally:
                os.kill(pid, signal.SIGCONT)
        finally:
            client.stop()
        r.close()
    assert elapsed < 1.0 + LATE_S, elapsed
    assert {res.status for res in results} <= {Status.TIMEOUT, Status.NOT_AVAILABLE}
    assert [m["tool_call_id"] for m in messages] == ["c0", "c1", "c2"]
