"""The host application's lifecycle signals for calls the producer answers without publishing.

Real fleet (the guarded extension, available to acme and denied to globex), real Redis,
both clients; the receivers are plain blinker receivers connected in the test process.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from conftest import Either, Fleet, delete_namespace, start_fleet
from toolfleet.shared import codec
from toolfleet.shared.naming import catalog_key
from toolfleet.shared.signals import tool_requested, tool_responded

pytestmark = pytest.mark.slow

LEAK = "ext_guarded_leak"
GONE = "ext_gone_noop"


@pytest.fixture(scope="module")
def guarded_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process serving the guarded extension (acme allowed, globex denied)."""
    fleet = start_fleet(
        redis_url,
        f"{namespace}-sig-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("sig") / "worker.log",
        processes=1,
        extra=["--extension", "guarded_ext:extension"],
        env={"TFTEST_GUARDED_API_KEY": "sk-" + uuid.uuid4().hex},
    )
    yield fleet
    fleet.stop()


@pytest.fixture
def unserved_namespace(redis_url: str, namespace: str) -> Iterator[str]:
    """A namespace whose catalog lists GONE on a queue no live worker serves."""
    ns = f"{namespace}-gone-{uuid.uuid4().hex[:6]}"
    r = redis.Redis.from_url(redis_url)
    entry = {"name": GONE, "description": "x", "parameters": {}, "queue": "tools.gone"}
    r.hset(catalog_key(ns), GONE, codec.dumps(entry))
    r.close()
    yield ns
    delete_namespace(redis_url, ns)


@pytest.fixture
def signals() -> Iterator[list[tuple[str, dict[str, Any]]]]:
    """Every producer-side tool_requested / tool_responded the process fires, in order."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def on_requested(sender: str, **event: Any) -> None:
        seen.append(("requested", event))

    def on_responded(sender: str, **event: Any) -> None:
        seen.append(("responded", event))

    tool_requested.connect(on_requested)
    tool_responded.connect(on_responded)
    yield seen
    tool_requested.disconnect(on_requested)
    tool_responded.disconnect(on_responded)


def _of(seen: list[tuple[str, dict[str, Any]]], tool_call_id: str) -> list[tuple[str, Any]]:
    """``(kind, status)`` of the producer's signals for the call with ``tool_call_id``."""
    return [
        (kind, event.get("status"))
        for kind, event in seen
        if event.get("side") == "producer" and event.get("tool_call_id") == tool_call_id
    ]


def _turn(function: str, tool_call_id: str) -> list[dict[str, Any]]:
    return [{"id": tool_call_id, "type": "function", "function": {"name": function,
             "arguments": "{}"}}]  # fmt: skip


CASES = [
    # (where, function, account, status)
    ("guarded", "ext_nothing_here", "acme", "unknown_function"),
    ("guarded", LEAK, "globex", "not_available"),  # denied to the account
    ("unserved", GONE, "acme", "not_available"),  # no live worker
]


@pytest.mark.parametrize(("where", "function", "account", "status"), CASES)
def test_a_call_refused_before_publishing_fires_requested_and_responded_with_its_status(
    guarded_fleet: Fleet,
    unserved_namespace: str,
    make: Callable[..., Either],
    signals: list[tuple[str, dict[str, Any]]],
    where: str,
    function: str,
    account: str,
    status: str,
) -> None:
    """A call the producer refuses without publishing (unknown function, no live worker, an
    account the extension denies) fires tool_requested, then tool_responded with that status,
    for call and for a turn's call."""
    ns = guarded_fleet.namespace if where == "guarded" else unserved_namespace
    client = make(guarded_fleet.redis_url, namespace=ns)
    single, in_turn = f"one-{uuid.uuid4().hex[:8]}", f"turn-{uuid.uuid4().hex[:8]}"
    started = time.monotonic()
    result = client.call(function, {}, tool_call_id=single, context={"account": account})
    (message,) = client.dispatch(_turn(function, in_turn), context={"account": account})
    assert time.monotonic() - started < 5  # answered by the producer, not by a deadline
    assert result.status.value == status
    assert "error" in json.loads(message["content"])
    assert _of(signals, single) == [("requested", None), ("responded", status)]
    assert _of(signals, in_turn) == [("requested", None), ("responded", status)]
    requested = next(e for k, e in signals if k == "requested" and e["tool_call_id"] == single)
    assert requested["function"] == function and requested["account"] == account
    assert requested["id"] == result.id
