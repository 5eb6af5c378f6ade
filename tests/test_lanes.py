"""Account lanes: the shard rule, and lane depth beside the one queue depth in metrics."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import orjson
import pytest
import redis

from conftest import delete_namespace
from toolfleet.producer.publish import Publisher
from toolfleet.shared.naming import catalog_key
from toolfleet.shared.tenancy.lanes import LANES, lane_key, shard_for
from toolfleet.shared.wire import CallContext, ToolCallRequest
from toolfleet.worker.supervision.exposition import QueueCollector

QUEUE = "tools.lanes-test"


@pytest.fixture
def ns(redis_url: str) -> Iterator[str]:
    namespace = f"tflanes-{uuid.uuid4().hex[:8]}"
    yield namespace
    delete_namespace(redis_url, namespace)


def _request(account: str) -> ToolCallRequest:
    now = time.time()
    return ToolCallRequest(
        id=str(uuid.uuid4()), function="ext_lanes_test_tool", arguments={},
        context=CallContext(account=account), reply_to="nowhere", deadline=now + 30,
        timeout_s=30.0, sent_at=now,
    )  # fmt: skip


def test_every_account_has_two_distinct_lanes_and_every_lane_is_used() -> None:
    """shard_for gives two different lanes in range, the same for the same account."""
    shards = [shard_for(f"account-{i}") for i in range(2000)]
    assert all(a != b and 0 <= a < LANES and 0 <= b < LANES for a, b in shards)
    assert shard_for("acme") == shard_for("acme")
    assert {lane for shard in shards for lane in shard} == set(range(LANES))


def test_an_account_fills_the_shorter_of_its_lanes_and_metrics_show_both_depths(
    redis_url: str, ns: str
) -> None:
    """10 calls of one account split 5/5 over its two lanes; depth stays one number per queue."""
    r = redis.Redis.from_url(redis_url)
    r.hset(catalog_key(ns), "ext_lanes_test_tool", orjson.dumps({"name": "x", "queue": QUEUE}))
    publisher = Publisher(r, ns)
    for _ in range(10):
        assert publisher.publish(QUEUE, _request("acme")) is None
    first, second = shard_for("acme")
    assert [r.llen(lane_key(ns, QUEUE, lane)) for lane in (first, second)] == [5, 5]
    families = {f.name: f for f in QueueCollector(redis_url, ns).collect()}
    (depth,) = families["toolfleet_queue_depth"].samples
    assert depth.labels == {"queue": QUEUE} and depth.value == 10
    lanes = {s.labels["lane"]: s.value for s in families["toolfleet_queue_lane_depth"].samples}
    assert len(lanes) == LANES
    assert lanes[str(first)] == lanes[str(second)] == 5 and sum(lanes.values()) == 10
    r.close()
