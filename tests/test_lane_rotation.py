"""The lane rotation: a fetch finds a waiting lane in O(1) commands, keeping the invariant.

Invariant (``shared/tenancy/lanes.py``): a lane is non-empty iff its number is in the
queue's rotation (``<queue>.lanes-active``) exactly once. Commands are counted with
``INFO commandstats`` of a private Redis, so that the counts are this test's alone.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from private_redis import Server, command_counts
from toolfleet.producer.publish import Publisher
from toolfleet.shared.naming import brokers_key, lane_key, lanes_active_key
from toolfleet.shared.tenancy.lanes import LANES, shard_for
from toolfleet.shared.wire import CallContext, ToolCallRequest
from toolfleet.worker.messaging.broker import FleetRedisBroker, make_broker
from toolfleet.worker.messaging.recovery import recover_dead_worker

QUEUE = "tools.rotation"
NS = "tfrot"


@pytest.fixture
def broker(counting_server: Server) -> Iterator[FleetRedisBroker]:
    """A worker's broker on the private Redis."""
    made = make_broker(counting_server.url, NS)
    yield made
    made.client.close()


def _publish(client: redis.Redis, account: str) -> str:
    """Publish one call of ``account``; return its Redis message id (the new id on a lane)."""
    lanes = [lane_key(NS, QUEUE, lane) for lane in shard_for(account)]
    before = {i for lane in lanes for i in client.lrange(lane, 0, -1)}
    now = time.time()
    request = ToolCallRequest(
        id=str(uuid.uuid4()), function="ext_rotation_tool", arguments={},
        context=CallContext(account=account), reply_to="nowhere", deadline=now + 30,
        timeout_s=30.0, sent_at=now,
    )  # fmt: skip
    assert Publisher(client, NS).publish(QUEUE, request) is None
    (added,) = {i for lane in lanes for i in client.lrange(lane, 0, -1)} - before
    return str(added.decode())


def _assert_invariant(client: redis.Redis) -> None:
    """Each non-empty lane is in the rotation exactly once, and no other lane is."""
    rotation = [int(n) for n in client.lrange(lanes_active_key(NS, QUEUE), 0, -1)]
    non_empty = {n for n in range(LANES) if client.llen(lane_key(NS, QUEUE, n))}
    assert sorted(rotation) == sorted(non_empty), (rotation, non_empty)


def test_a_fetch_pops_only_the_lanes_holding_messages(broker: FleetRedisBroker) -> None:
    """With 2 of 16 lanes holding messages, each fetch runs 3 LPOPs: queue, rotation, lane."""
    r = broker.client
    first, second = shard_for("A")
    assert {first, second} == {9, 6}  # lanes far from 0, so a scan would pop empty ones
    ids = [_publish(r, "A") for _ in range(3)]  # lane 9: ids 0 and 2, lane 6: id 1
    assert {n for n in range(LANES) if r.llen(lane_key(NS, QUEUE, n))} == {first, second}
    fetched = []
    for _ in ids:
        r.config_resetstat()
        (pair,) = broker.fetch_with_ids(QUEUE, 1)
        counts = command_counts(r)
        fetched.append(pair[0])
        assert counts["lpop"] == 3, counts
        in_script = {k: v for k, v in counts.items() if not k.startswith(("evalsha", "script"))}
        assert sum(in_script.values()) <= 8, counts  # zadd, 3 lpop, llen, rpush, sadd, hget
        _assert_invariant(r)
    assert fetched == ids  # round robin over the two lanes, in the order they filled


def test_lanes_are_served_round_robin_whatever_their_depth(broker: FleetRedisBroker) -> None:
    """B's 2 calls behind A's 8 are fetched 2nd and 4th: the non-empty lanes take turns."""
    r = broker.client
    assert not set(shard_for("A")) & set(shard_for("B"))
    flood = [_publish(r, "A") for _ in range(8)]
    paced = [_publish(r, "B") for _ in range(2)]
    _assert_invariant(r)
    fetched = [redis_id for redis_id, _ in broker.fetch_with_ids(QUEUE, 4)]
    # rotation after the publishes: A's two lanes, then B's two
    assert fetched == [flood[0], flood[1], paced[0], paced[1]]
    rest = [redis_id for redis_id, _ in broker.fetch_with_ids(QUEUE, 10)]
    assert rest == flood[2:]
    assert not r.exists(lanes_active_key(NS, QUEUE))
    _assert_invariant(r)


def test_the_invariant_holds_after_a_dead_worker_s_messages_are_recovered(
    broker: FleetRedisBroker, counting_server: Server
) -> None:
    """Recovery requeues a dead process's messages; the rotation still matches the lanes."""
    r = broker.client
    dead = make_broker(counting_server.url, NS)
    try:
        ids = [_publish(r, account) for account in ("A", "B", "C", "A", "B", "C", "A")]
        held = [redis_id for redis_id, _ in dead.fetch_with_ids(QUEUE, 4)]
        assert len(held) == 4
        _assert_invariant(r)
        r.hset(brokers_key(NS), "host:1", dead.broker_id)
        assert recover_dead_worker(r, NS, "host:1") == 4
        _assert_invariant(r)
        drained: list[str] = []
        while batch := broker.fetch_with_ids(QUEUE, 2):
            drained += [redis_id for redis_id, _ in batch]
            _assert_invariant(r)
    finally:
        dead.client.close()
    assert sorted(drained) == sorted(ids) and set(drained[:4]) == set(held)  # held first
    assert not r.exists(lanes_active_key(NS, QUEUE))
    assert all(not r.llen(lane_key(NS, QUEUE, n)) for n in range(LANES))


def test_a_stale_or_lost_rotation_is_skipped_or_rebuilt(broker: FleetRedisBroker) -> None:
    """A rotation entry of an emptied lane is dropped; a lost rotation is rebuilt once."""
    r = broker.client
    a_ids = [_publish(r, "A") for _ in range(2)]  # one on each of A's lanes
    b_id = _publish(r, "B")
    r.delete(lane_key(NS, QUEUE, shard_for("A")[0]))  # emptied behind the scripts' back
    r.config_resetstat()
    (pair,) = broker.fetch_with_ids(QUEUE, 1)
    assert pair[0] == a_ids[1]
    assert (
        command_counts(r)["lpop"] == 5
    )  # queue, stale entry and its lane, next entry and its lane
    _assert_invariant(r)
    r.delete(lanes_active_key(NS, QUEUE))  # the rotation lost, B's lane still full
    assert [redis_id for redis_id, _ in broker.fetch_with_ids(QUEUE, 3)] == [b_id]
    _assert_invariant(r)
