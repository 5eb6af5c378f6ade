"""Fair scheduling across accounts: one account's flood does not queue another behind it."""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from conftest import TEST_QUEUE, Fleet, heap_frozen, start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared.naming import queue_msgs_key
from toolfleet.shared.tenancy.lanes import lane_keys, shard_for
from toolfleet.shared.wire import Status

SLEEP = "ext_fleet_test_sleep"
FLOOD = 5_000
#: Seconds between account B's calls.
PACE_S = 0.4
TOOL_S = 0.05
#: At most this many of A's calls may leave the queue while one of B's calls waits and runs:
#: B's call is fetched from its own lane at once and waits only behind what the workers
#: already hold (threads plus prefetch, a few dozen of A's calls); queued behind A's
#: backlog, it would wait for every one of the thousands still queued. A count, not a
#: time, so a loaded machine slows both sides alike.
OVERTAKEN_MAX = 400


@pytest.fixture(scope="module")
def fleet16(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes with eight threads each."""
    ns = f"{namespace}-{uuid.uuid4().hex[:6]}"
    log = tmp_path_factory.mktemp("fair") / "worker.log"
    running = start_fleet(redis_url, ns, log, processes=2, threads=8)
    yield running
    running.stop()


def _timed_call(client: ToolClient, account: str) -> float:
    """Seconds one call by ``account`` took, end to end."""
    started = time.monotonic()
    result = client.call(SLEEP, {"seconds": TOOL_S}, context={"account": account})
    assert result.status == Status.OK, result.content
    return time.monotonic() - started


def _paced_latencies(client: ToolClient, account: str, count: int) -> list[float]:
    """Seconds each of ``count`` calls by ``account`` took, one started every ``PACE_S``."""
    latencies = []
    for _ in range(count):
        latencies.append(_timed_call(client, account))
        time.sleep(max(0.0, PACE_S - latencies[-1]))
    return latencies


def test_a_flood_from_one_account_does_not_queue_another_behind_it(
    fleet16: Fleet, tmp_path: Path
) -> None:
    """While A's 5,000 calls drain, each of B's calls waits for at most a few dozen of them."""
    assert not set(shard_for("A")) & set(shard_for("B"))  # the accounts share no lane
    r = redis.Redis.from_url(fleet16.redis_url)
    depth_key = queue_msgs_key(fleet16.namespace, TEST_QUEUE)
    with (
        ToolClient(fleet16.redis_url, namespace=fleet16.namespace) as flood,
        ToolClient(fleet16.redis_url, namespace=fleet16.namespace) as paced,
    ):
        _paced_latencies(paced, "B", 3)  # warm up: connections, catalog, worker threads
        # the collections the flood's replies trigger would pause B here, not in the fleet
        with heap_frozen():
            figures = _measure(flood, paced, r, depth_key, fleet16.namespace)
    r.close()
    print(f"\nfairness figures: {figures}")
    # the flood was still there for every one of B's calls, more of it than B may see
    # overtake it (else the test shows nothing)
    assert figures["a_backlog_min"] > 2 * OVERTAKEN_MAX, figures
    assert figures["a_still_queued_after"] > 2 * OVERTAKEN_MAX, figures
    assert figures["answers"] == FLOOD, figures
    assert figures["errors"] == 0, figures
    # Then none of B's calls waited behind the backlog, only behind what the workers held
    assert figures["overtaken_max"] <= OVERTAKEN_MAX, figures


def _measure(
    flood: ToolClient, paced: ToolClient, r: redis.Redis, depth_key: str, namespace: str
) -> dict[str, Any]:
    """B's latencies before and while A's 5,000 calls drain, and what was queued meanwhile."""
    unloaded = _paced_latencies(paced, "B", 15)

    # Given A has just submitted 5,000 calls (one turn: one pipeline)
    calls = [
        {"id": f"call_{i}", "type": "function",
         "function": {"name": SLEEP, "arguments": json.dumps({"seconds": TOOL_S})}}
        for i in range(FLOOD)
    ]  # fmt: skip
    answers: list[dict[str, Any]] = []
    flooding = threading.Thread(
        target=lambda: answers.extend(
            flood.dispatch(calls, context={"account": "A"}, timeout_s=300)
        )
    )
    flooding.start()
    deadline = time.monotonic() + 60
    while int(r.hlen(depth_key)) < FLOOD * 0.8 and time.monotonic() < deadline:
        time.sleep(0.01)
    # When B calls every 0.4 s while A's backlog drains
    loaded: list[float] = []
    backlog: list[int] = []
    overtaken: list[int] = []  # A's calls that left the queue during each of B's calls
    while len(loaded) < 20:
        backlog.append(int(r.hlen(depth_key)))
        loaded.append(_timed_call(paced, "B"))
        overtaken.append(backlog[-1] - int(r.hlen(depth_key)))
        time.sleep(max(0.0, PACE_S - loaded[-1]))
    still_queued = int(r.hlen(depth_key))
    lanes = [int(r.llen(key)) for key in lane_keys(namespace, TEST_QUEUE)]
    flooding.join(timeout=300)
    return {
        "unloaded_p50_ms": round(statistics.median(unloaded) * 1000, 1),
        "unloaded_max_ms": round(max(unloaded) * 1000, 1),
        "loaded_p50_ms": round(statistics.median(loaded) * 1000, 1),
        "loaded_max_ms": round(max(loaded) * 1000, 1),
        "overtaken_p50": statistics.median(overtaken),
        "overtaken_max": max(overtaken),
        "a_backlog_min": min(backlog),
        "a_still_queued_after": still_queued,
        "lanes_after": lanes,
        "answers": len(answers),
        "errors": sum("error" in str(answer["content"]) for answer in answers),
    }
