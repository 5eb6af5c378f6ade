"""Clients made before ``fork()`` work in the child: own identity, connections, threads.

Each test is one client's, because the two follow a fork differently: the sync client
restarts its listener threads and keeps a caller's redis client (redis-py pools are
fork-aware); the async client binds to the child's first event loop and refuses a caller's
``redis.asyncio`` pool, which is neither fork- nor loop-aware.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio

from conftest import TESTS, Fleet
from private_redis import free_port
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared import ClientError, Status

ADD = "ext_fleet_test_add"
SLEEP = "ext_fleet_test_sleep"
DEADLINE_S = 3.0
#: Seconds past a deadline a forked child's answer may take on a loaded 2-core machine.
MARGIN_S = 2.0

FORK = multiprocessing.get_context("fork")


def _in_child(work: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    """Run ``work()`` in a forked child; return the dict it returns (or its exception text)."""
    results = FORK.Queue()

    def target() -> None:
        try:
            results.put(work())
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            results.put({"error": repr(exc)})

    child = FORK.Process(target=target)
    child.start()
    try:
        outcome: dict[str, Any] = results.get(timeout=timeout_s)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
            child.join()
    return outcome


def test_sync_client_made_before_fork_answers_in_the_child(fleet: Fleet) -> None:
    """A ToolClient used before fork answers ``ok`` in a multiprocessing (fork) child by the
    call's deadline, with its own client id and reply list; the parent keeps working."""
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        assert client.call(ADD, {"a": 1, "b": 2}, timeout_s=20).content == 3
        parent_ids = (client.client_id, client.reply_to)

        def work() -> dict[str, Any]:
            started = time.monotonic()
            result = client.call(ADD, {"a": 20, "b": 22}, timeout_s=DEADLINE_S)
            return {
                "status": str(result.status),
                "content": result.content,
                "elapsed_s": time.monotonic() - started,
                "ids": (client.client_id, client.reply_to),
            }

        outcome = _in_child(work)
        after = client.call(ADD, {"a": 5, "b": 5}, timeout_s=20)
    assert outcome.get("status") == "ok", outcome
    assert outcome["content"] == 42
    assert outcome["elapsed_s"] < DEADLINE_S + MARGIN_S
    child_id, child_reply_to = outcome["ids"]
    assert child_id != parent_ids[0] and child_reply_to != parent_ids[1]
    assert after.status is Status.OK and after.content == 10


def test_sync_client_on_a_callers_redis_client_answers_in_the_child(fleet: Fleet) -> None:
    """A ToolClient built on the caller's redis.Redis also answers in a forked child (redis-py's
    sync pools reset themselves there), with its own client id."""
    with ToolClient(
        redis_client=redis.Redis.from_url(fleet.redis_url), namespace=fleet.namespace
    ) as client:
        assert client.call(ADD, {"a": 1, "b": 2}, timeout_s=20).content == 3
        parent_id = client.client_id

        def work() -> dict[str, Any]:
            started = time.monotonic()
            result = client.call(ADD, {"a": 2, "b": 2}, timeout_s=DEADLINE_S)
            return {
                "content": result.content,
                "elapsed_s": time.monotonic() - started,
                "client_id": client.client_id,
            }

        outcome = _in_child(work)
    assert outcome.get("content") == 4, outcome
    assert outcome["elapsed_s"] < DEADLINE_S + MARGIN_S
    assert outcome["client_id"] != parent_id


def test_async_client_on_a_callers_pool_fails_at_once_in_the_child(fleet: Fleet) -> None:
    """An AsyncToolClient built on the caller's redis.asyncio client cannot follow a fork: in
    the child its first call raises ClientError at once, naming the fix."""
    client = AsyncToolClient(
        redis_client=redis.asyncio.Redis.from_url(fleet.redis_url), namespace=fleet.namespace
    )

    def work() -> dict[str, Any]:
        started = time.monotonic()
        try:
            asyncio.run(client.call(ADD, {"a": 1, "b": 1}, timeout_s=DEADLINE_S))
        except ClientError as exc:
            return {"error": str(exc), "elapsed_s": time.monotonic() - started}
        return {"error": ""}

    outcome = _in_child(work)
    assert "post_fork" in outcome["error"], outcome
    assert outcome["elapsed_s"] < 1.0


def test_call_in_flight_at_fork_resolves_at_once_in_the_child(fleet: Fleet) -> None:
    """A call the parent had in flight when it forked resolves ``timeout`` in the child at
    once (its reply goes to the parent), while the parent still gets its result."""
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        future = client.submit(SLEEP, {"seconds": 0.5}, timeout_s=20)

        def work() -> dict[str, Any]:
            started = time.monotonic()
            result = future.result(timeout=15)
            return {"status": str(result.status), "elapsed_s": time.monotonic() - started}

        outcome = _in_child(work)
        parent = future.result(timeout=20)
    assert outcome.get("status") == "timeout", outcome
    assert outcome["elapsed_s"] < MARGIN_S
    assert parent.status is Status.OK


def test_async_client_made_before_fork_answers_in_the_child(fleet: Fleet) -> None:
    """An AsyncToolClient used on the parent's loop answers ``ok`` in a forked child's own
    loop by the call's deadline, with its own client id."""
    client = AsyncToolClient(fleet.redis_url, namespace=fleet.namespace)
    loop = asyncio.new_event_loop()
    first = loop.run_until_complete(client.call(ADD, {"a": 1, "b": 2}, timeout_s=20))
    assert first.content == 3
    parent_id = client.client_id

    def work() -> dict[str, Any]:
        async def call() -> dict[str, Any]:
            started = time.monotonic()
            result = await client.call(ADD, {"a": 40, "b": 2}, timeout_s=DEADLINE_S)
            elapsed = time.monotonic() - started
            await client.close()
            return {
                "status": str(result.status),
                "content": result.content,
                "elapsed_s": elapsed,
                "client_id": client.client_id,
            }

        return asyncio.run(call())

    try:
        outcome = _in_child(work)
    finally:
        loop.run_until_complete(client.close())
        loop.close()
    assert outcome.get("status") == "ok", outcome
    assert outcome["content"] == 42
    assert outcome["elapsed_s"] < DEADLINE_S + MARGIN_S
    assert outcome["client_id"] != parent_id


def _gunicorn(fleet: Fleet, port: int, log_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "TOOLFLEET_REDIS_URL": fleet.redis_url,
        "TOOLFLEET_NAMESPACE": fleet.namespace,
    }
    argv = [
        str(Path(sys.executable).parent / "gunicorn"),
        "--preload",
        "--workers",
        "2",
        "--bind",
        f"127.0.0.1:{port}",
        "--timeout",
        "30",
        "fork_app:app",
    ]
    with log_path.open("wb") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_gunicorn_preload_workers_answer_calls_by_their_deadline(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Under ``gunicorn --preload`` (the client made and used in the master), every worker's
    calls answer ``ok`` by their 3 s deadline, each worker with its own client id."""
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    server = _gunicorn(fleet, port, log_path)
    try:
        url = f"http://127.0.0.1:{port}/"
        answers: list[dict[str, Any]] = []
        with httpx.Client(timeout=DEADLINE_S + 10) as http:
            ready_by = time.monotonic() + 60
            while not answers:
                if server.poll() is not None or time.monotonic() > ready_by:
                    pytest.fail(f"gunicorn did not serve:\n{log_path.read_text()}")
                try:
                    answers.append(http.get(url).json())
                except httpx.TransportError:
                    time.sleep(0.2)
            for _ in range(11):
                answers.append(http.get(url).json())
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    master = answers[0]["master"]
    assert [a["status"] for a in answers] == ["ok"] * 12, log_path.read_text()
    assert [a["content"] for a in answers] == [5] * 12
    assert max(a["elapsed_s"] for a in answers) < DEADLINE_S + MARGIN_S
    ids_by_pid = {a["pid"]: a["client_id"] for a in answers}
    assert master["pid"] not in ids_by_pid
    assert master["client_id"] not in ids_by_pid.values()
    assert len(set(ids_by_pid.values())) == len(ids_by_pid)  # one identity per worker
    assert all(a["reply_to"].endswith(a["client_id"]) for a in answers)


def test_a_client_whose_cluster_is_gone_leaves_the_others_working_in_the_child(
    fleet: Fleet, tmp_path: Path
) -> None:
    """Every client is reset in a forked child on its own: a cluster client whose nodes are
    gone (it cannot be made again there) does not leave another client with its parent's
    threads; that client answers by the deadline, and the cluster client's first use in the
    child raises ConnectionFailed instead of hanging."""
    from private_cluster import start_cluster

    from toolfleet.shared.errors import ConnectionFailed

    cluster = start_cluster(tmp_path, masters=3)
    try:
        stranded = ToolClient(cluster.url, namespace=fleet.namespace)
    finally:
        cluster.stop()
    warned: list[str] = []  # what the child logs as it forks (a handler it inherits)
    handler = logging.Handler()
    handler.emit = lambda record: warned.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("toolfleet.producer")
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        assert client.call(ADD, {"a": 1, "b": 2}, timeout_s=20).content == 3
        parent_id = client.client_id

        def work() -> dict[str, Any]:
            logger.removeHandler(handler)
            said = list(warned)
            started = time.monotonic()
            result = client.call(ADD, {"a": 3, "b": 4}, timeout_s=DEADLINE_S)
            elapsed = time.monotonic() - started
            try:
                stranded.call(ADD, {"a": 1, "b": 1}, timeout_s=DEADLINE_S)
                stranded_error = ""
            except ConnectionFailed as exc:
                stranded_error = str(exc)
            return {"content": result.content, "elapsed_s": elapsed,
                    "client_id": client.client_id, "stranded": stranded_error,
                    "said": said}  # fmt: skip

        logger.addHandler(handler)
        try:
            outcome = _in_child(work)
        finally:
            logger.removeHandler(handler)
    stranded.close()
    assert outcome.get("content") == 7, outcome
    assert outcome["elapsed_s"] < DEADLINE_S + MARGIN_S
    assert outcome["client_id"] != parent_id
    assert outcome["stranded"], outcome
    # the stranded client's reset failed, and said so in one line without a traceback
    assert [line for line in outcome["said"] if "not reset after fork()" in line], outcome
