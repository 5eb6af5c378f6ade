"""A cluster master SIGKILLed under load: calls answered by their deadline, then served."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from private_cluster import Cluster, Group, start_cluster, start_group, wait_live

from conftest import TEST_QUEUE
from toolfleet.producer import ToolClient
from toolfleet.shared.naming import group_namespace
from toolfleet.shared.wire import Status

F = "ext_fleet_test_"
ONCE = "ext_once_record"


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path, masters=3, replicas=1)
    yield cluster
    cluster.stop()


def _new_master_serves(cluster: Cluster, key: str, dead: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if cluster.master_of(key) != dead:
                return
        except Exception:  # noqa: BLE001, S110 - the cluster is reconfiguring
            pass
        time.sleep(0.2)
    raise AssertionError(f"no replica took over {key}'s slot in {timeout_s} s")


def _runs(path: Path) -> Counter[str]:
    """How many times the side-effect tool ran, per call id (its file of call ids)."""
    return Counter(path.read_text().split()) if path.exists() else Counter()


@pytest.mark.parametrize("claim_replicas", ["auto", "0"], ids=["wait-on", "wait-off"])
def test_master_killed_under_load(replicated: Cluster, tmp_path: Path, claim_replicas: str) -> None:
    """Every call in flight when its group's master dies is answered by its deadline; new
    calls are served once the replica took over. Counted per call: the answer the caller
    got, and how many times the non-idempotent tool ran (its own file, outside Redis).
    With ``WAIT`` on (the default) a call that ran twice must be one whose claim the
    worker logged as unreplicated."""
    ns = f"tff-{uuid.uuid4().hex[:6]}"
    env = {} if claim_replicas == "auto" else {"TOOLFLEET_CLAIM_REPLICAS": claim_replicas}
    once = ["--extension", "once_tools:extension", "-Q", "tools.once"]
    group: Group = start_group(replicated, ns, "alpha", TEST_QUEUE, tmp_path, env=env, extra=once)
    runs_file = tmp_path / "runs.txt"
    try:
        client_probe = replicated.client()
        try:
            wait_live(client_probe, ns, [group])
        finally:
            client_probe.close()
        prefix = group_namespace(ns, "alpha", cluster=True)
        port = replicated.master_of(prefix)
        victim = next(s for s in replicated.servers if s.url.endswith(f":{port}"))
        with ToolClient(replicated.url, namespace=ns) as client:
            assert client.call(F + "add", {"a": 1, "b": 1}).content == 2
            timeout_s = 15.0
            sent = time.time()
            futures = []
            arguments = {"path": str(runs_file), "hold_s": 0.005}
            for i in range(300):  # the master dies half way: calls queued, running, sent after
                if i == 150:
                    victim.process.kill()  # SIGKILL: no save, no goodbye to the cluster
                    victim.process.wait()
                futures.append(client.submit(ONCE, arguments, timeout_s=timeout_s))
            results = [f.result() for f in futures]
            assert time.time() - sent < timeout_s + 5  # every call resolved by its deadline
            statuses = {s.value: sum(r.status is s for r in results) for s in Status}
            for result in results:  # an answer, when ok, is the call's own
                if result.status is Status.OK:
                    assert result.content == {"ran": result.id}
            time.sleep(2)  # a second reply for a call, if one is posted, arrives by then
            late = client.late_replies  # replies for a call already resolved: dropped
            runs = _runs(runs_file)
            ids = {r.id for r in results}
            assert set(runs) <= ids  # nothing ran that was not sent
            twice = sorted(i for i, n in runs.items() if n > 1)
            ok_ran = sum(1 for r in results if r.status is Status.OK and runs[r.id] >= 1)
            not_ok_ran = sum(1 for r in results if r.status is not Status.OK and runs[r.id] >= 1)
            print(f"WAIT {claim_replicas}: the 300 calls:",
                  {k: v for k, v in statuses.items() if v},
                  f"| ran once {sum(1 for n in runs.values() if n == 1)}, twice or more "
                  f"{len(twice)}, never {len(ids - set(runs))} | answered ok and ran {ok_ran}, "
                  f"answered otherwise but ran {not_ok_ran} | late replies {late}")  # fmt: skip
            assert ok_ran == statuses["ok"]  # an ok answer is a run's
            if claim_replicas == "auto":
                unreplicated = [i for i in twice if f"call {i}: its claim reached" in group.log()]
                assert twice == unreplicated, (twice, group.log()[-3000:])
            _new_master_serves(replicated, prefix, port, timeout_s=30)
            deadline = time.monotonic() + 60
            last = None
            while time.monotonic() < deadline:
                last = client.call(F + "add", {"a": 20, "b": 22}, timeout_s=5)
                if last.status is Status.OK:
                    break
                time.sleep(0.5)
            assert last is not None and last.status is Status.OK, (last, group.log()[-3000:])
            assert last.content == 42
    finally:
        if group.process.poll() is None:
            group.process.terminate()
        group.process.wait(timeout=30)
