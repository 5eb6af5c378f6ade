"""The whole path through ``redis+cluster://``: the async client, idempotency keys, the CLI.

A real 3-master loopback cluster with two queue groups on two masters (the module fleet
of :func:`private_cluster.cluster_fleet`); no mock of Redis, Dramatiq or the CLI.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio.cluster
from private_cluster import (
    QUALITY_MODEL,
    ClusterFleet,
    cluster_fleet,
    start_group,
    stop_groups,
    wait_live,
)

from conftest import bfcl_file, toolfleet_command
from private_redis import free_port
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.producer._core.keyspace import KeySpace
from toolfleet.producer.publish import Publisher
from toolfleet.shared.naming import (
    acks_key,
    brokers_key,
    claim_key,
    function_name,
    group_namespace,
)
from toolfleet.shared.wire import (
    ReplyEnvelope,
    Status,
    ToolCallRequest,
    ToolCallResult,
    new_call_id,
)
from toolfleet.worker.pipeline.ledger import owner_of

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


# -- BFCL calls --------------------------------------------------------------------------

#: The BFCL calls with a reference result, under ``TOOLFLEET_BFCL_DIR``.
BFCL_EXPECTED = ("derived", "BFCL_v3_exec_expected_results.jsonl")


def _close_to(actual: Any, expected: Any) -> bool:
    """``actual`` equals ``expected``, floats to a relative 1e-9 (the reference's rounding)."""
    if isinstance(expected, float) and isinstance(actual, int | float):
        return math.isclose(actual, expected, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(expected, list) and isinstance(actual, list):
        return len(actual) == len(expected) and all(map(_close_to, actual, expected))
    if isinstance(expected, dict) and isinstance(actual, dict):
        return actual.keys() == expected.keys() and all(
            _close_to(actual[k], v) for k, v in expected.items()
        )
    return bool(actual == expected)


def test_bfcl_calls_are_answered_correctly_through_a_cluster_url(cfleet: ClusterFleet) -> None:
    """Every offline BFCL call of the reference file, sent through ``redis+cluster://`` to the
    BFCL group, answers its reference result (or the tool error the reference expects)."""
    path = bfcl_file(*BFCL_EXPECTED)  # skips, saying what to set, without the data
    calls = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            entry = json.loads(line)
            calls += [(entry["id"], c) for c in entry["calls"] if c["offline"]]
    assert len(calls) > 100, len(calls)
    with ToolClient(cfleet.url, namespace=cfleet.namespace) as client:
        futures = [
            client.submit(function_name("bfcl", c["name"]), c["arguments"], timeout_s=120)
            for _, c in calls
        ]
        results = [f.result() for f in futures]
    wrong = []
    for (case, call), result in zip(calls, results, strict=True):
        if "expected_result" in call:
            if result.status is not Status.OK or not _close_to(
                result.content, call["expected_result"]
            ):
                wrong.append((case, call["name"], result.status, result.content))
        elif result.status.value != call["expected_status"]:
            wrong.append((case, call["name"], result.status, call["expected_status"]))
    assert not wrong, wrong[:10]


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


def test_cli_tools_top_and_events_on_a_cluster(cfleet: ClusterFleet) -> None:
    """``tools``, ``top --once`` and ``events`` read each key in its slot: both groups show."""
    with ToolClient(cfleet.url, namespace=cfleet.namespace) as client:
        assert client.call(F + "add", {"a": 1, "b": 2}, timeout_s=30).content == 3
        assert client.call(FACTORIAL, {"n": 4}, timeout_s=30).content == 24
    listed = _cli(cfleet, "tools")
    assert F + "add" in listed and FACTORIAL in listed
    frame = _cli(cfleet, "top", "--once")
    for queue in (cfleet.test_group.queue, cfleet.bfcl_group.queue):
        # the queue's row: depth 0, no dead letters, its one live worker process
        assert any(line.split()[:1] == [queue] or f" {queue} " in line for line in
                   frame.splitlines()), frame  # fmt: skip
    assert F + "add" in frame and FACTORIAL in frame
    # every function's calls came from both groups' streams (the window holds ours)
    rows = {cells[0]: cells for line in frame.splitlines()
            if len(cells := re.split(r"\s{2,}", line.strip())) == 6}  # fmt: skip
    assert F + "add" in rows and FACTORIAL in rows, frame
    # events from the start of both groups' streams: every event of both is printed
    reader = cfleet.cluster.client()
    try:
        lengths = [reader.xlen(f"{cfleet.prefix(g)}:events")
                   for g in (cfleet.test_group, cfleet.bfcl_group)]  # fmt: skip
    finally:
        reader.close()
    assert all(lengths), lengths
    lines = _cli(cfleet, "events", "--from-start", "--count", str(sum(lengths))).splitlines()
    assert len(lines) == sum(lengths)
    functions = {json.loads(line).get("function") for line in lines}
    assert {F + "add", FACTORIAL} <= functions, lines


def test_cli_events_follows_new_events_of_both_groups(cfleet: ClusterFleet) -> None:
    """``events`` (no --from-start) prints the events of calls made after it started, of
    both groups (a call on each group per round until it printed its count)."""
    argv = [toolfleet_command(), "events", "--count", "6"]
    process = subprocess.Popen(argv, env=cfleet.env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180  # the CLI's start is slow on a loaded machine
        with ToolClient(cfleet.url, namespace=cfleet.namespace) as client:
            while process.poll() is None and time.monotonic() < deadline:
                assert client.call(F + "add", {"a": 7, "b": 8}, timeout_s=30).content == 15
                assert client.call(FACTORIAL, {"n": 3}, timeout_s=30).content == 6
                time.sleep(0.5)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    events = [json.loads(line) for line in out.splitlines()]
    assert len(events) == 6, events
    assert {e["function"] for e in events} == {F + "add", FACTORIAL}, events


def test_mcp_gateway_over_stdio_on_a_cluster(cfleet: ClusterFleet) -> None:
    """``toolfleet mcp serve`` on a cluster URL: tools/list has both groups' tools and
    tools/call answers on each."""
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    params = StdioServerParameters(command=toolfleet_command(), args=["mcp", "serve"],
                                   env=cfleet.env())  # fmt: skip

    async def scenario() -> tuple[set[str], Any, Any]:
        async with Client(params) as client:
            listed = await client.list_tools()
            add = await client.call_tool(F + "add", {"a": 20, "b": 22})
            fact = await client.call_tool(FACTORIAL, {"n": 5})
            return {tool.name for tool in listed.tools}, add, fact

    names, add, fact = anyio.run(scenario)
    assert {F + "add", FACTORIAL} <= names
    for result, text in ((add, "42"), (fact, "120")):
        assert not result.is_error, result
        assert [block.text for block in result.content] == [text], result  # type: ignore[union-attr]
        assert (result.meta or {})["toolfleet/status"] == "ok", result


def _quality_calls(cfleet: ClusterFleet) -> dict[tuple[str, str], int]:
    """``toolfleet quality --format json --model QUALITY_MODEL`` on the cluster URL: that
    model's calls per (function, status)."""
    # a day back: the module's calls all stay in the window
    report = json.loads(
        _cli(cfleet, "quality", "--since", "1d", "--model", QUALITY_MODEL, "--format", "json")
    )
    counts: dict[tuple[str, str], int] = {}
    for row in report["rows"]:  # one row per function and model
        assert row["model"] == QUALITY_MODEL, row
        for status, calls in row["statuses"].items():
            counts[row["function"], status] = counts.get((row["function"], status), 0) + calls
    return counts


def test_quality_reads_both_groups_aggregates_on_a_cluster(cfleet: ClusterFleet) -> None:
    """``toolfleet quality`` on a cluster URL counts the calls of both groups, each group's
    per-minute aggregates read in its own slot: 3 invalid adds and 2 factorials, made by a
    model no other test names (the module's other calls count as ``other``)."""
    model = {"llmclient": QUALITY_MODEL}
    with ToolClient(cfleet.url, namespace=cfleet.namespace) as client:
        for _ in range(3):
            bad = client.call(F + "add", {"a": 1}, context=model, timeout_s=30)
            assert bad.status is Status.INVALID_ARGUMENTS, bad
        for n in (3, 4):
            done = client.call(FACTORIAL, {"n": n}, context=model, timeout_s=30)
            assert done.content == FACTORIALS[n], done
    want = {(F + "add", "invalid_arguments"): 3, (FACTORIAL, "ok"): 2}
    deadline = time.monotonic() + 60  # written at heartbeat time (every 0.5 s here)
    seen: dict[tuple[str, str], int] = {}
    while time.monotonic() < deadline:
        seen = _quality_calls(cfleet)
        if all(seen.get(key, 0) >= count for key, count in want.items()):
            break
        time.sleep(0.5)
    assert seen == want, seen


def test_exporter_reports_both_groups_queues_on_a_cluster(
    cfleet: ClusterFleet, tmp_path: Path
) -> None:
    """``toolfleet exporter`` on a cluster URL: each group's queue has its one live worker
    process and depth 0 when idle, and each group's function its worker, read by slot."""
    from prometheus_client.parser import text_string_to_metric_families

    port = free_port()
    log_path = tmp_path / "exporter.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([toolfleet_command(), "exporter", "--port", str(port)],
                                   env={**cfleet.env(), "TOOLFLEET_WORKER_TTL_S": "3"},
                                   stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        samples: dict[tuple[str, str], float] = {}
        want = {
            ("toolfleet_queue_workers", cfleet.test_group.queue): 1.0,
            ("toolfleet_queue_workers", cfleet.bfcl_group.queue): 1.0,
            ("toolfleet_queue_depth", cfleet.test_group.queue): 0.0,
            ("toolfleet_queue_depth", cfleet.bfcl_group.queue): 0.0,
            ("toolfleet_function_workers", F + "add"): 1.0,
            ("toolfleet_function_workers", FACTORIAL): 1.0,
        }
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert process.poll() is None, log_path.read_text()
            try:
                url = f"http://127.0.0.1:{port}/metrics"
                with urllib.request.urlopen(url, timeout=10) as reply:
                    text = reply.read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            samples = {
                (s.name, s.labels.get("queue") or s.labels.get("function", "")): s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
            }
            if all(key in samples for key in want):
                break
            time.sleep(0.2)
        assert {key: samples.get(key) for key in want} == want, log_path.read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)


# -- SIGKILL of a worker process under load ------------------------------------------------

RECOVERY_QUEUE = "tools.recovery"
COUNT = "ext_recovery_count"


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return sorted(int(p) for p in out.stdout.split())


def test_sigkill_of_a_worker_under_load_on_a_cluster(
    cfleet: ClusterFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """300 calls of a non-idempotent tool on a group of 2 worker processes, one SIGKILLed
    mid-run: every call gets exactly one reply (read straight from the group's reply
    list), ``ok`` (ran once) or ``crashed`` (it was running on the killed process, and is
    not run again); no call runs twice."""
    folder = tmp_path_factory.mktemp("kill")
    group = start_group(cfleet.cluster, cfleet.namespace, "kill", RECOVERY_QUEUE, folder,
                        processes=2, threads=4,
                        extension="guarantee_tools:recovery_extension")  # fmt: skip
    r = cfleet.cluster.client()
    total = 300
    try:
        wait_live(r, cfleet.namespace, [group])
        prefix = group_namespace(cfleet.namespace, "kill", cluster=True)
        keys = KeySpace(cfleet.namespace, True, f"bulk-{time.time_ns()}")
        keys.learn({COUNT: {"queue": RECOVERY_QUEUE, "group": "kill"}})
        now = time.time()
        requests = [
            ToolCallRequest(id=new_call_id(), function=COUNT,
                            arguments={"key": f"{prefix}:count:{i}", "seconds": 0.05},
                            reply_to="set-by-the-publisher", deadline=now + 240,
                            timeout_s=240.0, sent_at=now)
            for i in range(total)
        ]  # fmt: skip
        runs_key = {request.id: request.arguments["key"] for request in requests}  # type: ignore[index]
        publisher = Publisher(r, cfleet.namespace, keys=keys)  # type: ignore[arg-type]
        outcomes = publisher.publish_many([(RECOVERY_QUEUE, request) for request in requests])
        assert all(outcome is None for outcome in outcomes), outcomes[:3]
        (reply_to,) = keys.reply_lists()
        assert reply_to == f"{prefix}:reply:{keys.client_id}"
        replies: dict[str, list[ToolCallResult]] = {}

        def drain(timeout_s: float) -> None:
            popped = r.blpop([reply_to], timeout=timeout_s)
            while popped is not None:
                envelope = ReplyEnvelope.decode(popped[1])
                assert envelope.type == "result" and envelope.result is not None
                replies.setdefault(envelope.result.id, []).append(envelope.result)
                raw = r.lpop(reply_to)
                popped = (reply_to.encode(), raw) if raw is not None else None

        deadline = time.monotonic() + 120
        while len(replies) < total // 5 and time.monotonic() < deadline:
            drain(1.0)
        assert len(replies) >= total // 5, f"only {len(replies)} replies before the kill"
        assert len(replies) < total, "every call was answered before the kill: not mid-run"
        victim = _children(group.process.pid)[0]
        worker_id = f"{socket.gethostname()}:{victim}"
        broker_id = r.hget(brokers_key(prefix), worker_id)
        assert broker_id is not None, worker_id
        os.kill(victim, signal.SIGSTOP)  # freeze it to read what it holds, then kill it
        time.sleep(0.1)
        held = r.smembers(acks_key(prefix, broker_id.decode(), RECOVERY_QUEUE))  # type: ignore[union-attr]
        os.kill(victim, signal.SIGKILL)
        assert held, "the killed process held no calls: not mid-run"
        deadline = time.monotonic() + 240
        while len(replies) < total and time.monotonic() < deadline:
            drain(1.0)
        drain(3.0)  # a second reply to any call would arrive here
        assert len(replies) == total, f"{total - len(replies)} calls unanswered"
        twice = {call_id: len(got) for call_id, got in replies.items() if len(got) != 1}
        assert not twice, f"calls answered more than once: {list(twice.items())[:5]}"
        results = {call_id: got[0] for call_id, got in replies.items()}
        assert {result.status for result in results.values()} <= {Status.OK, Status.CRASHED}
        counted = r.mget_nonatomic(list(runs_key.values()))
        runs = dict(zip(runs_key, (int(v or 0) for v in counted), strict=True))
        for call_id, result in results.items():
            if result.status is Status.OK:
                assert runs[call_id] == 1 and result.content == 1, (result, runs[call_id])
            else:
                assert runs[call_id] <= 1, (result, runs[call_id])
        crashed = [result for result in results.values() if result.status is Status.CRASHED]
        for result in crashed:
            assert owner_of(r.get(claim_key(prefix, result.id)).decode()) == worker_id  # type: ignore[union-attr]
        print(
            f"\nSIGKILL on a cluster under {total} calls: {len(held)} held by the killed "
            f"process, {len(crashed)} of them running → crashed; every call answered once"
        )
    finally:
        stop_groups([group])
        r.close()


def test_a_quota_set_on_a_cluster_refuses_over_it(cfleet: ClusterFleet) -> None:
    """``toolfleet limits set`` on a cluster URL: an account's second factorial within its
    rate is refused before it is published; its calls on the other group still run."""
    account = f"acme-{time.time_ns()}"
    _cli(cfleet, "limits", "set", f"{account}/{FACTORIAL}", "--per-s", "0.01", "--burst", "1")
    try:
        with ToolClient(cfleet.url, namespace=cfleet.namespace) as client:
            context = {"account": account}
            first = client.call(FACTORIAL, {"n": 5}, context=context, timeout_s=30)
            second = client.call(FACTORIAL, {"n": 5}, context=context, timeout_s=30)
            other = client.call(F + "add", {"a": 1, "b": 1}, context=context, timeout_s=30)
    finally:
        _cli(cfleet, "limits", "delete", f"{account}/{FACTORIAL}")
    assert (first.status, first.content) == (Status.OK, 120)
    assert second.status is Status.REJECTED, second
    assert second.content["retry_after_s"] > 0, second.content
    assert (other.status, other.content) == (Status.OK, 2)
