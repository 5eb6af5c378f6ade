"""The worker runs its own loop on Dramatiq's queues: Dramatiq is the transport only.

A plain Dramatiq producer (its own ``RedisBroker`` and actor, declared here with the
queue's actor name) is served by a toolfleet worker, now and delayed; and no module of
the worker imports Dramatiq's ``Worker``, its middleware or its private consumer.
"""

from __future__ import annotations

import ast
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.brokers.redis import RedisBroker

from conftest import TEST_QUEUE, Fleet, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared.naming import actor_name_for, claim_key
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest

WORKER = Path(__file__).resolve().parents[1] / "worker"
ECHO = "ext_fleet_test_echo"


def _request(namespace: str, text: str) -> ToolCallRequest:
    now = time.time()
    return ToolCallRequest(
        id=str(uuid.uuid4()),
        function=ECHO,
        arguments={"text": text},
        reply_to=f"{namespace}:reply:plain-{uuid.uuid4().hex[:8]}",
        deadline=now + 60,
        timeout_s=30.0,
        sent_at=now,
    )


def _result(r: redis.Redis, reply_to: str, timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        popped = r.blpop([reply_to], timeout=1)
        if popped is None:
            continue
        envelope = ReplyEnvelope.model_validate_json(popped[1])
        if envelope.result is not None:
            return envelope.result
    raise AssertionError(f"no result on {reply_to} within {timeout_s} s")


@pytest.fixture
def plain_actor(fleet: Fleet) -> Iterator[tuple[dramatiq.Actor[Any, Any], redis.Redis]]:
    """A Dramatiq actor of another application, named as the test queue's actor."""
    broker = RedisBroker(url=fleet.redis_url, namespace=fleet.namespace, middleware=[])
    actor: dramatiq.Actor[Any, Any] = dramatiq.actor(
        actor_name=actor_name_for(TEST_QUEUE), queue_name=TEST_QUEUE, broker=broker
    )(print)
    r = redis.Redis.from_url(fleet.redis_url)
    yield actor, r
    r.close()
    broker.close()


def test_a_plain_dramatiq_send_to_a_toolfleet_queue_is_answered(
    plain_actor: tuple[dramatiq.Actor[Any, Any], redis.Redis], fleet: Fleet
) -> None:
    """``actor.send(request)`` from plain Dramatiq runs the tool and posts its reply."""
    actor, r = plain_actor
    request = _request(fleet.namespace, "plain")
    actor.send(request.encode().decode())
    result = _result(r, request.reply_to, 60)
    assert result.status is Status.OK
    assert result.id == request.id and result.content["text"] == "plain"


def test_a_plain_dramatiq_delayed_send_runs_after_its_delay(
    plain_actor: tuple[dramatiq.Actor[Any, Any], redis.Redis], fleet: Fleet
) -> None:
    """``send_with_options(delay=...)`` goes through Dramatiq's delay queue and still runs."""
    actor, r = plain_actor
    request = _request(fleet.namespace, "later")
    sent = time.monotonic()
    actor.send_with_options(args=(request.encode().decode(),), delay=1500)
    assert r.hlen(f"{fleet.namespace}:{TEST_QUEUE}.DQ.msgs") >= 1
    result = _result(r, request.reply_to, 60)
    assert time.monotonic() - sent >= 1.4
    assert result.status is Status.OK and result.content["text"] == "later"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and r.hlen(f"{fleet.namespace}:{TEST_QUEUE}.DQ.msgs"):
        time.sleep(0.1)
    assert r.hlen(f"{fleet.namespace}:{TEST_QUEUE}.DQ.msgs") == 0  # acked on the delay queue


#: What no worker module may import: Dramatiq's worker, its middleware, its private consumer.
FORBIDDEN = {("dramatiq", "Worker"), ("dramatiq.brokers.redis", "_RedisConsumer")}
FORBIDDEN_MODULES = ("dramatiq.middleware", "dramatiq.worker")


def _offences(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith(FORBIDDEN_MODULES):
                found.append(f"from {node.module} import ...")
            for alias in node.names:
                if (node.module, alias.name) in FORBIDDEN or alias.name == "_RedisConsumer":
                    found.append(f"from {node.module} import {alias.name}")
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
            found += [f"import {name}" for name in names if name.startswith(FORBIDDEN_MODULES)]
        elif isinstance(node, ast.Attribute) and node.attr in ("Worker", "middleware"):
            if isinstance(node.value, ast.Name) and node.value.id == "dramatiq":
                found.append(ast.unparse(node))
        elif isinstance(node, ast.Attribute | ast.Name) and "_RedisConsumer" in ast.unparse(node):
            found.append(ast.unparse(node))
    return found


def test_no_worker_module_imports_dramatiqs_worker_middleware_or_consumer() -> None:
    """Dramatiq is the transport only: its Worker, middleware and _RedisConsumer are unused."""
    offences = {
        str(path.relative_to(WORKER)): found
        for path in sorted(WORKER.rglob("*.py"))
        if (found := _offences(path))
    }
    assert offences == {}


@pytest.fixture(scope="module")
def one_slot(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process with one slot thread, serving the inline tools."""
    ns = f"{namespace}-inline-{uuid.uuid4().hex[:6]}"
    log_path = tmp_path_factory.mktemp("inline") / "worker.log"
    running = start_fleet(redis_url, ns, log_path, processes=1, threads=1,
                          extra=["--extension", "inline_tools:extension"])  # fmt: skip
    yield running
    running.stop()


def test_a_sync_tool_runs_on_the_slot_thread_that_took_its_call(one_slot: Fleet) -> None:
    """No hand-off: the thread running a plain sync tool is the loop's slot thread."""
    with ToolClient(one_slot.redis_url, namespace=one_slot.namespace) as client:
        result = client.call("ext_inline_test_thread_name", {}, timeout_s=60)
    assert result.status is Status.OK
    assert str(result.content).startswith("toolfleet-slot-"), result.content


def test_the_fetch_claims_the_calls_it_takes(one_slot: Fleet) -> None:
    """Fetch is claim: calls of a burst are claimed by the script that fetched them.

    A fetch's claim tokens are ``<worker id>#<random><n>.<i>`` (a claim made apart from
    the fetch has no ``.``); only the first fetch after a wait (whose ids are not known
    beforehand) leaves its calls to be claimed apart.
    """
    (pid,) = one_slot.worker_pids()
    owner = f"{socket.gethostname()}:{pid}#"
    r = redis.Redis.from_url(one_slot.redis_url)
    try:
        with ToolClient(one_slot.redis_url, namespace=one_slot.namespace) as client:
            futures = [
                client.submit("ext_inline_test_thread_name", {}, timeout_s=60) for _ in range(20)
            ]
            results = [future.result(timeout=60) for future in futures]
        assert {res.status for res in results} == {Status.OK}
        tokens = [r.get(claim_key(one_slot.namespace, res.id)) for res in results]
        assert all(t is not None and t.decode().startswith(owner) for t in tokens), tokens
        by_fetch = sum("." in t.decode().partition("#")[2] for t in tokens if t is not None)
        assert by_fetch >= 10, tokens  # 19 expected: one fetch follows a wait
    finally:
        r.close()


def test_an_overrun_sync_tool_is_answered_and_a_fresh_thread_takes_its_slot(
    one_slot: Fleet,
) -> None:
    """Past its 1-second limit the call is answered ``timeout``; the process's one slot is
    served by a fresh thread while the abandoned one still sleeps, and that thread ends
    once its tool returns (its late result dropped)."""
    with ToolClient(one_slot.redis_url, namespace=one_slot.namespace) as client:
        overrun = client.submit("ext_inline_test_nap", {"seconds": 20}, timeout_s=60)
        assert overrun.result(timeout=30).status is Status.TIMEOUT
        following = client.call("ext_inline_test_thread_name", {}, timeout_s=60)
        assert following.status is Status.OK
        assert str(following.content).startswith("toolfleet-slot-r"), following.content
        assert not overrun.done() or overrun.result().status is Status.TIMEOUT
        short = client.call("ext_inline_test_nap", {"seconds": 2}, timeout_s=60)
        assert short.status is Status.TIMEOUT
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "ended (call of" not in one_slot.log():
            time.sleep(0.2)
        assert "ended (call of" in one_slot.log()  # the abandoned thread unwound and ended
        again = client.call("ext_inline_test_thread_name", {}, timeout_s=60)
        assert again.status is Status.OK


def test_an_idle_process_only_waits_in_redis(counting_server: Any, tmp_path: Path) -> None:
    """Between heartbeats an idle process and its supervisor send nothing but blocking waits:
    the watchdog reads the process's in-flight table in shared memory, not Redis."""
    from private_redis import command_counts

    fleet = start_fleet(
        counting_server.url, "tfidle", tmp_path / "worker.log", processes=1, threads=2,
        env={"TOOLFLEET_HEARTBEAT_INTERVAL_S": "60", "TOOLFLEET_WORKER_TTL_S": "180"},
    )  # fmt: skip
    r = redis.Redis.from_url(counting_server.url)
    try:
        with ToolClient(counting_server.url, namespace="tfidle") as client:
            assert client.call(ECHO, {"text": "warm"}, timeout_s=60).status is Status.OK
        time.sleep(3.0)  # the call's outcome, the start-up's last writes
        r.config_resetstat()
        time.sleep(6.0)
        counts = command_counts(r)
    finally:
        r.close()
        fleet.stop()
    assert set(counts) <= {"blmove"}, counts
