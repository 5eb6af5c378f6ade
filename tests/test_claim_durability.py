"""Claims of non-idempotent calls wait for a replica (``WAIT``) on a replicated cluster.

What a call costs on its group's master is counted with ``INFO commandstats`` (command
counts only, no timing), with the wait on (the default on a replicated master) and off
(``TOOLFLEET_CLAIM_REPLICAS=0``).
"""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from private_cluster import Cluster, Group, start_cluster, start_group, wait_live

from conftest import TEST_QUEUE
from private_redis import Server
from toolfleet.producer import ToolClient
from toolfleet.shared.naming import group_namespace
from toolfleet.shared.wire import Status

F = "ext_fleet_test_"
CALLS = 200


@pytest.fixture(scope="module")
def replicated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("replicated"), masters=3, replicas=1)
    yield cluster
    cluster.stop()


def _stop(group: Group) -> None:
    if group.process.poll() is None:
        group.process.terminate()
    group.process.wait(timeout=30)


def _master(cluster: Cluster, prefix: str) -> redis.Redis:
    return redis.Redis(port=cluster.master_of(prefix))


def _replica_of(cluster: Cluster, master: redis.Redis) -> Server:
    port = int(master.info("replication")["slave0"]["port"])
    return next(s for s in cluster.servers if s.url.endswith(f":{port}"))


def _commands(master: redis.Redis) -> dict[str, int]:
    """Calls per command since the last ``CONFIG RESETSTAT``, from ``INFO commandstats``."""
    stats = master.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def _run(cluster: Cluster, tmp_path: Path, claim_replicas: str | None) -> dict[str, int]:
    """``CALLS`` calls of a non-idempotent tool on a fresh group; the master's command counts."""
    ns = f"tfd-{uuid.uuid4().hex[:6]}"
    env = {} if claim_replicas is None else {"TOOLFLEET_CLAIM_REPLICAS": claim_replicas}
    group = start_group(cluster, ns, "dur", TEST_QUEUE, tmp_path, env=env)
    try:
        probe = cluster.client()
        try:
            wait_live(probe, ns, [group])
        finally:
            probe.close()
        master = _master(cluster, group_namespace(ns, "dur", cluster=True))
        with ToolClient(cluster.url, namespace=ns) as client:
            assert client.call(F + "add", {"a": 1, "b": 2}, timeout_s=20).content == 3
            master.config_resetstat()
            futures = [
                client.submit(F + "add", {"a": i, "b": 1}, timeout_s=60) for i in range(CALLS)
            ]
            results = [f.result() for f in futures]
            counts = _commands(master)
        assert [r.status for r in results] == [Status.OK] * CALLS
        assert [r.content for r in results] == [i + 1 for i in range(CALLS)]
        assert "reached 0 of" not in group.log()
        return counts
    finally:
        _stop(group)


def test_wait_after_each_claim_costs_one_command_per_call(
    replicated: Cluster, tmp_path: Path
) -> None:
    """On: one ``WAIT`` per call on the group's master, nothing else added; off: none."""
    on = _run(replicated, tmp_path, None)
    off = _run(replicated, tmp_path, "0")
    total_on, total_off = sum(on.values()), sum(off.values())
    print(f"commands per call on the group's master, {CALLS} calls: "
          f"WAIT on {total_on / CALLS:.2f}, off {total_off / CALLS:.2f}; "
          f"on {sorted(on.items())}; off {sorted(off.items())}")  # fmt: skip
    assert on.get("wait", 0) == CALLS
    assert off.get("wait", 0) == 0
    # one claim per call either way (its MGET of outcome and cancel marker counts it)
    assert on.get("mget", 0) == off.get("mget", 0) == CALLS


def test_a_stalled_replica_delays_claims_by_the_timeout_and_calls_still_run(
    replicated: Cluster, tmp_path: Path
) -> None:
    """With the replica stopped (SIGSTOP) no claim is acknowledged: each call waits the
    timeout, runs anyway, and the worker logs the shortfall."""
    ns = f"tfs-{uuid.uuid4().hex[:6]}"
    group = start_group(replicated, ns, "lag", TEST_QUEUE, tmp_path,
                        env={"TOOLFLEET_CLAIM_REPLICAS_TIMEOUT_MS": "300"})  # fmt: skip
    replica: Server | None = None
    try:
        probe = replicated.client()
        try:
            wait_live(probe, ns, [group])
        finally:
            probe.close()
        master = _master(replicated, group_namespace(ns, "lag", cluster=True))
        replica = _replica_of(replicated, master)
        with ToolClient(replicated.url, namespace=ns) as client:
            assert client.call(F + "add", {"a": 1, "b": 2}, timeout_s=20).content == 3
            os.kill(replica.process.pid, signal.SIGSTOP)
            started = time.monotonic()
            results = [client.call(F + "add", {"a": i, "b": 0}, timeout_s=20) for i in range(5)]
            took = time.monotonic() - started
        assert [r.content for r in results] == [0, 1, 2, 3, 4]
        assert took >= 5 * 0.3 - 0.05  # each claim waited its 300 ms for the stopped replica
        deadline = time.monotonic() + 10
        while group.log().count("reached 0 of 1 replicas") < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert group.log().count("reached 0 of 1 replicas") == 5, group.log()[-3000:]
    finally:
        if replica is not None:
            os.kill(replica.process.pid, signal.SIGCONT)
        _stop(group)
