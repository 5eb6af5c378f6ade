"""Session affinity shared by every producer: a conversation's REPL from any process and MCP."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import redis
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from test_python_tool import _load_python

from conftest import TESTS, Fleet, require_sandbox, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.producer.mcp import CONVERSATION_META_KEY
from toolfleet.shared import Status
from toolfleet.shared.affinity import Route, decode_route, encode_route
from toolfleet.shared.naming import affinity_queue_for, route_key, workers_key

PYTHON = "ext_python_run"
FRESH = "fresh Python interpreter"


@pytest.fixture(scope="module")
def repl_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes serving the python extension (it needs its sandbox)."""
    require_sandbox()
    fleet = start_fleet(
        redis_url,
        f"{namespace}-aff-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("affinity") / "worker.log",
        processes=2,
        threads=4,
        extra=_load_python(),
    )
    yield fleet
    fleet.stop()


class Producer:
    """A producer process of its own (tests/repl_producer.py) taking calls on stdin."""

    def __init__(self, fleet: Fleet, kind: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(TESTS / "repl_producer.py"), fleet.redis_url, fleet.namespace,
             kind],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip

    def run(self, code: str, context: dict[str, str]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"code": code, "context": context}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, "the producer process exited"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _gateway(fleet: Fleet) -> StdioServerParameters:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "TOOLFLEET_REDIS_URL": fleet.redis_url,
           "TOOLFLEET_NAMESPACE": fleet.namespace}  # fmt: skip
    return StdioServerParameters(
        command=toolfleet_command(), args=["mcp", "serve", "--account", "acme"], env=env
    )


def test_follow_ups_from_three_producer_processes_and_the_gateway_keep_state_12_of_12(
    repl_fleet: Fleet,
) -> None:
    """One conversation's calls rotate over 3 producer processes (2 sync, 1 async) and the
    MCP gateway (its _meta names the conversation): all 12 follow-ups see x, on one worker."""
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    context = {"account": "acme", "conversation": conversation}
    producers = [Producer(repl_fleet, kind) for kind in ("sync", "async", "sync")]
    answers: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with Client(_gateway(repl_fleet), mode="legacy") as gateway:
            first = await anyio.to_thread.run_sync(producers[0].run, "x = 0", context)
            assert first["status"] == "ok" and first["content"]["error"] is None, first
            answers.append(first)
            for n in range(1, 13):
                if n % 4 == 3:  # every fourth follow-up goes through the gateway
                    result = await gateway.call_tool(
                        PYTHON, {"code": "x += 1\nx"}, meta={CONVERSATION_META_KEY: conversation}
                    )
                    assert not result.is_error, result
                    answers.append({"content": result.structured_content, "worker": None})
                else:
                    producer = producers[n % 4 if n % 4 < 3 else 0]
                    answers.append(
                        await anyio.to_thread.run_sync(producer.run, "x += 1\nx", context)
                    )

    try:
        anyio.run(scenario)
    finally:
        for producer in producers:
            producer.stop()
    kept = [a for n, a in enumerate(answers[1:], 1) if a["content"]["result"] == str(n)]
    assert len(kept) == 12, [a["content"] for a in answers]
    assert {a["worker"] for a in answers if a["worker"]} == {answers[0]["worker"]}
    assert repl_fleet.live_workers("tools.python") == 2


def test_a_conversation_without_meta_keeps_its_repl_per_gateway_connection(
    repl_fleet: Fleet,
) -> None:
    """Without _meta, a stdio connection is one conversation: its calls share variables; a
    second connection starts its own."""

    async def scenario() -> list[Any]:
        seen = []
        for _ in range(2):
            async with Client(_gateway(repl_fleet), mode="legacy") as gateway:
                for code in ("z = 41" if not seen else "'z' in dir()", "z + 1"):
                    result = await gateway.call_tool(PYTHON, {"code": code})
                    seen.append(result.structured_content)
        return seen

    first, second, fresh, _ = anyio.run(scenario)
    assert first["error"] is None and second["result"] == "42"
    assert fresh["result"] == "False"


def test_a_route_to_a_gone_slot_falls_back_to_a_fresh_interpreter_that_says_so(
    repl_fleet: Fleet,
) -> None:
    """A conversation whose route names a slot without live workers: its call goes to the
    tool's queue at once, starts a fresh interpreter whose note names the gone process, and
    the new route is recorded for the next calls."""
    ns = repl_fleet.namespace
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    context = {"account": "acme", "conversation": conversation}
    gone = affinity_queue_for("tools.python", "gone-host-1-0")
    key = route_key(ns, "acme", conversation, PYTHON)
    r = redis.Redis.from_url(repl_fleet.redis_url)
    try:
        r.zadd(workers_key(ns, gone), {"gone-host:1": time.time() - 100})
        r.set(key, encode_route(Route(gone, "gone-host:1")), ex=60)
        with ToolClient(repl_fleet.redis_url, namespace=ns) as client:
            started = time.monotonic()
            result = client.call(PYTHON, {"code": "w = 7\nw"}, context=context, timeout_s=30)
            elapsed = time.monotonic() - started
            assert result.status is Status.OK, result
            assert result.content["result"] == "7"
            assert FRESH in result.content["stderr"] and "gone-host:1" in result.content["stderr"]
            assert elapsed < 20, "the call waited on the gone slot's queue"
            route = decode_route(r.get(key))
            assert route is not None and route.worker == result.worker and route.queue != gone
            again = client.call(PYTHON, {"code": "w"}, context=context, timeout_s=30)
            assert again.content["result"] == "7" and FRESH not in again.content["stderr"]
    finally:
        r.delete(key, workers_key(ns, gone))
        r.close()


def test_a_conversation_whose_process_died_says_so_to_the_next_producer(
    repl_fleet: Fleet,
) -> None:
    """Kill the process holding a conversation's interpreter: the next call, from another
    producer process, reaches its replacement and the note says the holder is gone."""
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    context = {"account": "acme", "conversation": conversation}
    producer = Producer(repl_fleet, "sync")
    try:
        with ToolClient(repl_fleet.redis_url, namespace=repl_fleet.namespace) as client:
            first = client.call(PYTHON, {"code": "v = 1"}, context=context, timeout_s=30)
        assert first.status is Status.OK, first
        os.kill(int(str(first.worker).rsplit(":", 1)[1]), signal.SIGKILL)
        after = producer.run("v = 2\nv", context)
        assert after["status"] == "ok" and after["content"]["result"] == "2", after
        assert after["worker"] != first.worker
        assert (
            FRESH in after["content"]["stderr"] and str(first.worker) in after["content"]["stderr"]
        )
        again = producer.run("v", context)
        assert again["content"]["result"] == "2" and again["worker"] == after["worker"]
    finally:
        producer.stop()
        repl_fleet.wait_ready()
