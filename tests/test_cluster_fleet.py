"""A fleet on a real Redis Cluster: two queue groups, each in its own slot on its own master."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest
import redis
import redis.cluster
from private_cluster import ClusterFleet, cluster_fleet

from conftest import toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared.connect import sync_client
from toolfleet.shared.naming import (
    broker_heartbeats_key,
    catalog_key,
    fleet_namespace,
    reply_key,
)
from toolfleet.shared.wire import Status

F = "ext_fleet_test_"
FACTORIAL = "ext_bfcl_math_factorial"


@pytest.fixture(scope="module")
def cfleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFleet]:
    with cluster_fleet(tmp_path_factory.mktemp("cfleet")) as fleet:
        yield fleet


@pytest.fixture
def cclient(cfleet: ClusterFleet) -> Iterator[ToolClient]:
    with ToolClient(cfleet.url, namespace=cfleet.namespace) as client:
        yield client


def test_two_groups_live_on_two_masters(cfleet: ClusterFleet, cclient: ToolClient) -> None:
    """Each group's keys sit on the master of its slot; the catalog in the fleet slot."""
    assert cclient.call(F + "add", {"a": 2, "b": 3}).content == 5
    assert cclient.call(FACTORIAL, {"n": 5}).content == 120
    homes = set()
    for group in (cfleet.test_group, cfleet.bfcl_group):
        key = broker_heartbeats_key(cfleet.prefix(group))
        port = cfleet.cluster.master_of(key)
        node = redis.Redis(port=port)  # a plain client: the key must be on this very node
        try:
            assert node.zcard(key) == 1, (group.name, key)
        finally:
            node.close()
        homes.add(port)
    assert len(homes) == 2
    fleet = fleet_namespace(cfleet.namespace, cluster=True)
    node = redis.Redis(port=cfleet.cluster.master_of(catalog_key(fleet)))
    try:
        assert node.hexists(catalog_key(fleet), F + "add")
        assert node.hexists(catalog_key(fleet), FACTORIAL)
    finally:
        node.close()


def test_a_turn_across_groups(cclient: ToolClient) -> None:
    """One turn calling both groups answers each call in order, correctly."""
    turn = [
        {"id": "c1", "type": "function",
         "function": {"name": F + "add", "arguments": '{"a": 40, "b": 2}'}},
        {"id": "c2", "type": "function",
         "function": {"name": FACTORIAL, "arguments": '{"n": 10}'}},
    ]  # fmt: skip
    messages = cclient.dispatch(turn, timeout_s=30)
    assert [m["tool_call_id"] for m in messages] == ["c1", "c2"]
    assert messages[0]["content"] == "42"
    assert messages[1]["content"] == "3628800"


def test_a_burst_on_both_groups_is_answered_once_per_call(
    cfleet: ClusterFleet, cclient: ToolClient
) -> None:
    """200 calls spread over both groups: each answered with its own result, no reply left over."""
    adds = [cclient.submit(F + "add", {"a": i, "b": 1000}, timeout_s=60) for i in range(100)]
    facts = [cclient.submit(FACTORIAL, {"n": i % 15}, timeout_s=60) for i in range(100)]
    assert [f.result().content for f in adds] == [i + 1000 for i in range(100)]
    expected = [1, 1, 2, 6, 24, 120, 720, 5040, 40320, 362880, 3628800, 39916800,
                479001600, 6227020800, 87178291200]  # fmt: skip
    assert [f.result().content for f in facts] == [expected[i % 15] for i in range(100)]
    time.sleep(0.5)  # a second reply to any call would be on a reply list by now
    client = cfleet.cluster.client()
    try:
        for group in (cfleet.test_group, cfleet.bfcl_group):
            assert client.llen(reply_key(cfleet.prefix(group), cclient.client_id)) == 0
    finally:
        client.close()


def test_cancel_of_a_queued_call(cclient: ToolClient) -> None:
    """A call canceled while queued behind busy threads resolves canceled."""
    blockers = [cclient.submit(F + "sleep", {"seconds": 0.8}, timeout_s=20) for _ in range(2)]
    time.sleep(0.2)
    queued = cclient.submit(F + "add", {"a": 1, "b": 1}, timeout_s=20)
    assert cclient.cancel(queued.call_id)
    assert queued.result().status is Status.CANCELED
    assert [b.result().status for b in blockers] == [Status.OK, Status.OK]


def _switch(cfleet: ClusterFleet, state: str, name: str) -> None:
    env = {**os.environ, "TOOLFLEET_REDIS_URL": cfleet.url, "TOOLFLEET_NAMESPACE": cfleet.namespace}
    done = subprocess.run([toolfleet_command(), "switch", state, name], env=env,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_switch_applies_to_the_next_call(cfleet: ClusterFleet, cclient: ToolClient) -> None:
    """``toolfleet switch off`` on a cluster URL refuses the very next call; ``on`` restores it."""
    assert cclient.call(F + "add", {"a": 1, "b": 2}).content == 3
    _switch(cfleet, "off", F + "add")
    try:
        refused = cclient.call(F + "add", {"a": 1, "b": 2})
        assert refused.status is Status.NOT_AVAILABLE, refused
        assert cclient.call(FACTORIAL, {"n": 3}).content == 6  # the other group is untouched
    finally:
        _switch(cfleet, "on", F + "add")
    assert cclient.call(F + "add", {"a": 1, "b": 2}).content == 3


def test_a_cluster_url_reaches_the_worker_through_the_client(cfleet: ClusterFleet) -> None:
    """``sync_client`` of the fleet's URL sees both groups' calls' outcomes in their slots."""
    client = sync_client(cfleet.url)
    try:
        assert isinstance(client, redis.cluster.RedisCluster)
    finally:
        client.close()
