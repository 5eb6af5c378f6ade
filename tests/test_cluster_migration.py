"""A queue group's slot migrated to another master while calls run: each answered once.

The migration is made as ``redis-cli --cluster reshard`` makes it, for the one slot of the
group (reshard picks its own slots): ``CLUSTER SETSLOT <slot> IMPORTING`` on the target,
``MIGRATING`` on the source, ``MIGRATE`` of the slot's keys in batches until none is
left, then ``SETSLOT <slot> NODE <target>`` on every master.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from private_cluster import Cluster, Group, start_cluster, start_group, wait_live

from conftest import TEST_QUEUE
from toolfleet.producer import ToolClient
from toolfleet.shared.naming import group_namespace
from toolfleet.shared.wire import Status

ONCE = "ext_once_record"
CALLS = 300
#: keys per MIGRATE (redis-cli's ``--cluster-pipeline`` default)
BATCH = 10


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    started = start_cluster(tmp_path, masters=3)
    yield started
    started.stop()


def migrate_slot(cluster: Cluster, slot: int, source_port: int, target_port: int) -> int:
    """Move ``slot`` from one master to another, key by key; the keys moved.

    A pause between batches stretches the migration over the calls in flight.
    """
    source, target = redis.Redis(port=source_port), redis.Redis(port=target_port)
    source.config_resetstat()
    target.config_resetstat()
    try:
        source_id = source.cluster("myid")
        target_id = target.cluster("myid")
        target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        moved = 0
        seen: Counter[bytes] = Counter()
        while True:
            keys = source.execute_command("CLUSTER", "GETKEYSINSLOT", slot, BATCH)
            if not keys:
                break
            seen.update(keys)
            again = [(k, source.type(k), target.exists(k)) for k in keys if seen[k] > 3]
            assert not again, f"keys that stay on the source: {again}"
            try:
                source.execute_command("MIGRATE", "127.0.0.1", target_port, "", 0, 5000,
                                       "KEYS", *keys)  # fmt: skip
            except redis.ResponseError as exc:
                both = [(k, source.type(k), target.type(k)) for k in keys if target.exists(k)]
                raise AssertionError(f"{exc}: on both masters: {both}") from exc
            moved += len(keys)
            time.sleep(0.05)
        target.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        source.execute_command("CLUSTER", "SETSLOT", slot, "NODE", target_id)
        for port in cluster.ports:
            if port not in (source_port, target_port):
                redis.Redis(port=port).execute_command(
                    "CLUSTER", "SETSLOT", slot, "NODE", target_id
                )
        return moved
    finally:
        source.close()
        target.close()


def test_slot_migrated_while_300_calls_run(cluster: Cluster, tmp_path: Path) -> None:
    """Every call sent while its group's slot moves is answered ok by its deadline with
    its own result, and the non-idempotent tool ran exactly once per call; the slot ends
    on the target master and new calls are served there."""
    ns = f"tfm-{uuid.uuid4().hex[:6]}"
    once = ["--extension", "once_tools:extension", "-Q", "tools.once"]
    group: Group = start_group(cluster, ns, "alpha", TEST_QUEUE, tmp_path, extra=once)
    runs_file = tmp_path / "runs.txt"
    try:
        probe = cluster.client()
        try:
            wait_live(probe, ns, [group])
            prefix = group_namespace(ns, "alpha", cluster=True)
            slot = probe.keyslot(prefix + ":x")
            source_port = int(probe.get_node_from_key(prefix + ":x").port)
            target_port = next(int(n.port) for n in probe.get_primaries() if n.port != source_port)
        finally:
            probe.close()
        arguments = {"path": str(runs_file), "hold_s": 0.01}
        timeout_s = 60.0
        with ToolClient(cluster.url, namespace=ns) as client:
            assert client.call(ONCE, arguments, timeout_s=20).status is Status.OK
            runs_file.unlink()
            moved: list[int] = []
            migration = threading.Thread(
                target=lambda: moved.append(migrate_slot(cluster, slot, source_port, target_port))
            )
            sent = time.monotonic()
            futures = []
            for i in range(CALLS):  # the migration starts once a third is sent
                if i == CALLS // 3:
                    migration.start()
                futures.append(client.submit(ONCE, arguments, timeout_s=timeout_s))
                if i % 10 == 0:
                    time.sleep(0.01)  # calls keep arriving through the migration
            migration.join(timeout=120)
            assert not migration.is_alive() and moved, "the migration did not finish"
            in_flight = sum(not f.done() for f in futures)  # still running when it ended
            results = [f.result() for f in futures]
            took = time.monotonic() - sent
            refused = {}  # what the masters answered during the migration
            for port in (source_port, target_port):
                stats = redis.Redis(port=port).info("errorstats")
                refused[port] = {k.removeprefix("errorstat_"): v["count"] for k, v in stats.items()}
            runs = Counter(runs_file.read_text().split())
            statuses = Counter(r.status.value for r in results)
            print(f"slot {slot} {source_port} -> {target_port}: {moved[0]} keys moved; "
                  f"{CALLS} calls in {took:.1f} s: {dict(statuses)}; "
                  f"runs per call {dict(Counter(runs.values()))}; in flight at the "
                  f"migration's end {in_flight}; redirections and refusals {refused}")  # fmt: skip
            assert in_flight > 0  # the calls did run through the migration
            redirected = sum(refused[source_port].get(e, 0) for e in ("ASK", "TRYAGAIN", "MOVED"))
            assert redirected > 0  # and met it
            assert took < timeout_s + 5
            assert [r.status for r in results] == [Status.OK] * CALLS, group.log()[-3000:]
            assert [r.content for r in results] == [{"ran": r.id} for r in results]
            assert len({r.id for r in results}) == CALLS
            assert runs == Counter({r.id: 1 for r in results})  # each ran exactly once
            assert cluster.master_of(prefix) == target_port
            after = client.call(ONCE, arguments, timeout_s=20)
            assert after.status is Status.OK and after.content == {"ran": after.id}
        assert "Traceback" not in group.log(), group.log()[-5000:]
    finally:
        if group.process.poll() is None:
            group.process.terminate()
        group.process.wait(timeout=30)
