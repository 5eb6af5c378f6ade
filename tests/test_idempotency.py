"""Idempotency keys: a call submitted again under its key runs nothing, gets the first outcome."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import TESTS, Either, Fleet, start_fleet
from toolfleet.shared import IdempotencyKeyError, Status

RECORD = "ext_once_record"


@pytest.fixture(scope="module")
def once_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes serving the side-effect tool."""
    fleet = start_fleet(
        redis_url,
        f"{namespace}-once-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("once") / "worker.log",
        processes=2,
        threads=8,
        extra=["--extension", "once_tools:extension"],
    )
    yield fleet
    fleet.stop()


def _runs(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_two_producer_processes_submitting_one_key_200_times_run_the_tool_once(
    once_fleet: Fleet, tmp_path: Path
) -> None:
    """100 submissions from a ToolClient process and 100 from an AsyncToolClient process,
    racing under one key: the tool ran once and all 200 got that run's outcome."""
    path, go = tmp_path / "runs", tmp_path / "go"
    key = f"order-{uuid.uuid4().hex[:8]}"
    producers = [
        subprocess.Popen(
            [
                sys.executable,
                str(TESTS / "idempotent_producer.py"),
                once_fleet.redis_url,
                once_fleet.namespace,
                kind,
                key,
                str(path),
                "100",
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for kind in ("sync", "async")
    ]
    go.touch()
    lines: list[dict[str, object]] = []
    for producer in producers:
        out, err = producer.communicate(timeout=120)
        assert producer.returncode == 0, err
        lines += [json.loads(line) for line in out.splitlines()]
    (ran,) = _runs(path)  # the side effect happened exactly once
    assert len(lines) == 200
    assert all(line["status"] == "ok" and line["content"] == {"ran": ran} for line in lines)
    first = [line for line in lines if line["id"] == ran]
    assert len(first) == 1 and first[0]["duplicate_of"] is None
    others = [line for line in lines if line["id"] != ran]
    assert len(others) == 199 and all(line["duplicate_of"] == ran for line in others)


def test_a_key_used_again_for_another_call_is_refused(
    once_fleet: Fleet, make: Callable[..., Either], tmp_path: Path
) -> None:
    """The same key with other arguments or another function raises IdempotencyKeyError and
    runs nothing; the same key under another account is another key."""
    client = make(once_fleet.redis_url, namespace=once_fleet.namespace)
    path = tmp_path / "runs"
    key = f"k-{uuid.uuid4().hex[:8]}"
    first = client.call(RECORD, {"path": str(path)}, context={"account": "a"}, idempotency_key=key)
    assert first.status is Status.OK, first
    with pytest.raises(IdempotencyKeyError, match="different call"):
        client.call(RECORD, {"path": str(path), "hold_s": 0.1}, context={"account": "a"},
                    idempotency_key=key)  # fmt: skip
    with pytest.raises(IdempotencyKeyError, match="different call"):
        client.call("ext_fleet_test_echo", {"text": "x"}, context={"account": "a"},
                    idempotency_key=key)  # fmt: skip
    again = client.call(RECORD, json.dumps({"path": str(path)}), context={"account": "a"},
                        idempotency_key=key)  # fmt: skip
    assert again.duplicate_of == first.id and again.content == first.content
    assert _runs(path) == [first.id]
    other = client.call(RECORD, {"path": str(path)}, context={"account": "b"}, idempotency_key=key)
    assert other.status is Status.OK and other.duplicate_of is None
    assert _runs(path) == [first.id, other.id]


def test_a_turn_submitted_again_under_its_key_is_answered_with_the_first_outcomes(
    once_fleet: Fleet, make: Callable[..., Either], tmp_path: Path
) -> None:
    """dispatch(..., idempotency_key=K) twice: each call ran once, the answers are the same."""
    client = make(once_fleet.redis_url, namespace=once_fleet.namespace)
    paths = [tmp_path / "a", tmp_path / "b"]
    message = {
        "role": "assistant",
        "tool_calls": [
            {"id": f"call_{n}", "type": "function",
             "function": {"name": RECORD, "arguments": json.dumps({"path": str(p)})}}
            for n, p in enumerate(paths)
        ],
    }  # fmt: skip
    key = f"turn-{uuid.uuid4().hex[:8]}"
    first = client.dispatch(message, idempotency_key=key, timeout_s=20)
    second = client.dispatch(message, idempotency_key=key, timeout_s=20)
    assert second == first
    assert [len(_runs(p)) for p in paths] == [1, 1]
    assert [json.loads(m["content"])["ran"] for m in first] == [_runs(p)[0] for p in paths]


def test_a_bad_key_is_misuse(once_fleet: Fleet, make: Callable[..., Either]) -> None:
    """An empty or non-string key is refused before anything is published."""
    from toolfleet.shared import ClientError

    client = make(once_fleet.redis_url, namespace=once_fleet.namespace)
    for bad in ("", 5, "x" * 257):
        with pytest.raises(ClientError, match="idempotency_key"):
            client.call(RECORD, {"path": "/nonexistent/never"}, idempotency_key=bad)


def test_the_gateway_takes_the_key_from_meta(once_fleet: Fleet, tmp_path: Path) -> None:
    """tools/call with _meta toolfleet/idempotency_key: sent twice, the tool ran once and both
    answers are its outcome; the key with other arguments is an isError naming the misuse."""
    import os

    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from conftest import toolfleet_command
    from toolfleet.producer.mcp import IDEMPOTENCY_META_KEY

    env = {**os.environ, "TOOLFLEET_REDIS_URL": once_fleet.redis_url,
           "TOOLFLEET_NAMESPACE": once_fleet.namespace}  # fmt: skip
    params = StdioServerParameters(command=toolfleet_command(), args=["mcp", "serve"], env=env)
    path = tmp_path / "runs"
    meta = {IDEMPOTENCY_META_KEY: f"mcp-{uuid.uuid4().hex[:8]}"}

    async def scenario() -> list[object]:
        async with Client(params, mode="legacy") as gateway:
            answers = [await gateway.call_tool(RECORD, {"path": str(path)}, meta=meta)
                       for _ in range(2)]  # fmt: skip
            answers.append(
                await gateway.call_tool(RECORD, {"path": str(path), "hold_s": 0.1}, meta=meta)
            )
            return answers

    first, second, misuse = anyio.run(scenario)
    (ran,) = _runs(path)
    assert first.structured_content == second.structured_content == {"ran": ran}  # type: ignore[attr-defined]
    assert misuse.is_error and "different call" in str(misuse.content)  # type: ignore[attr-defined]


def test_a_calls_fingerprint_is_its_function_and_arguments_canonically() -> None:
    """The raw JSON string and the object are one call, key order aside; another function or
    other arguments are another call; integers past 64 bits and non-JSON text still digest."""
    from toolfleet.shared.idempotency import fingerprint

    same = fingerprint("f", {"a": 1, "b": [1, 2]})
    assert fingerprint("f", '{"b": [1, 2], "a": 1}') == same
    assert fingerprint("f", {"b": [1, 2], "a": 1}) == same
    assert fingerprint("g", {"a": 1, "b": [1, 2]}) != same
    assert fingerprint("f", {"a": 2, "b": [1, 2]}) != same
    assert fingerprint("f", {"a": 10**30}) != fingerprint("f", {"a": 10**30 + 1})
    assert fingerprint("f", "not json") != fingerprint("f", None)
    assert len(same) == 64
