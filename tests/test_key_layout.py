"""Key layout: unchanged on a plain Redis; on a cluster, a slot per queue group and the fleet."""

from __future__ import annotations

import redis
from redis.crc import key_slot

from conftest import Fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import naming as n
from toolfleet.shared.naming import fleet_namespace, group_namespace
from toolfleet.shared.tenancy.lanes import lanes_active_key


def _group_keys(prefix: str) -> list[str]:
    queue, call = "tools.x", "c1"
    return [
        n.queue_key(prefix, queue), n.queue_msgs_key(prefix, queue),
        n.dead_letters_key(prefix, queue), n.acks_key(prefix, "b", queue),
        n.broker_heartbeats_key(prefix), n.lane_key(prefix, queue, 3),
        lanes_active_key(prefix, queue), n.claim_key(prefix, call), n.outcome_key(prefix, call),
        n.cancel_key(prefix, call), n.inflight_key(prefix, "w"), n.concurrency_key(prefix, "f"),
        n.breaker_key(prefix, "f"), n.quota_inflight_key(prefix, "a"),
        n.quota_rate_key(prefix, "a"), n.limits_key(prefix), n.switches_key(prefix),
        n.reply_key(prefix, "client"), n.events_key(prefix), n.brokers_key(prefix),
        n.settings_copied_key(prefix), n.broker_queues_key(prefix),
    ]  # fmt: skip


def _fleet_keys(prefix: str) -> list[str]:
    return [
        n.catalog_key(prefix), n.catalog_epoch_key(prefix), n.catalog_recovering_key(prefix),
        n.workers_key(prefix, "tools.x"), n.extension_errors_key(prefix),
        n.mcp_servers_key(prefix), n.catalog_live_key(prefix), n.catalog_owners_key(prefix),
        n.catalog_workers_key(prefix, "f"), n.catalog_schemas_key(prefix, "f"),
    ]  # fmt: skip


def test_plain_redis_key_names_are_unchanged() -> None:
    """Without a cluster the group changes nothing: every key keeps its old name."""
    prefix = group_namespace("toolfleet", "general", cluster=False)
    assert prefix == "toolfleet" == fleet_namespace(prefix)
    assert _group_keys(prefix) == [
        "toolfleet:tools.x", "toolfleet:tools.x.msgs", "toolfleet:tools.x.XQ",
        "toolfleet:__acks__.b.tools.x", "toolfleet:__heartbeats__", "toolfleet:tools.x.lane.3",
        "toolfleet:tools.x.lanes-active", "toolfleet:claim:c1", "toolfleet:outcome:c1",
        "toolfleet:cancel:c1", "toolfleet:inflight:w", "toolfleet:concurrency:f",
        "toolfleet:breaker:f", "toolfleet:quota:inflight:a", "toolfleet:quota:rate:a",
        "toolfleet:limits", "toolfleet:switches", "toolfleet:reply:client", "toolfleet:events",
        "toolfleet:brokers", "toolfleet:settings_copied", "toolfleet:__broker_queues__",
    ]  # fmt: skip
    assert _fleet_keys(prefix) == [
        "toolfleet:catalog", "toolfleet:catalog:epoch", "toolfleet:catalog:recovering",
        "toolfleet:workers:tools.x", "toolfleet:extension_errors", "toolfleet:mcp_servers",
        "toolfleet:catalog:live", "toolfleet:catalog:owners", "toolfleet:catalog:workers:f",
        "toolfleet:catalog:schemas:f",
    ]  # fmt: skip


def test_cluster_keys_of_a_group_share_its_slot_and_fleet_keys_theirs() -> None:
    """On a cluster each group's keys hash to one slot, the fleet-wide ones to another."""
    general = group_namespace("toolfleet", "general", cluster=True)
    other = group_namespace("toolfleet", "python", cluster=True)
    assert general == "toolfleet:{g.general}"
    slots = {key_slot(k.encode()) for k in _group_keys(general)}
    assert slots == {key_slot(b"g.general")}
    assert {key_slot(k.encode()) for k in _group_keys(other)} == {key_slot(b"g.python")}
    fleet = {key_slot(k.encode()) for k in _fleet_keys(general) + _fleet_keys(other)}
    assert fleet == {key_slot(b"fleet")}
    assert n.catalog_key(general) == "toolfleet:{fleet}:catalog"
    assert fleet_namespace("toolfleet", cluster=True) == "toolfleet:{fleet}"


def test_a_plain_fleet_writes_no_hash_tag(fleet: Fleet) -> None:
    """A fleet on a plain Redis writes its keys under the plain namespace, none with a tag."""
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        assert client.call("ext_fleet_test_add", {"a": 1, "b": 2}).content == 3
    r = redis.Redis.from_url(fleet.redis_url)
    try:
        keys = {k.decode() for k in r.scan_iter(match=f"{fleet.namespace}:*", count=1000)}
        assert f"{fleet.namespace}:catalog" in keys
        assert f"{fleet.namespace}:__heartbeats__" in keys
        assert f"{fleet.namespace}:workers:tools.fleet-test" in keys
        assert not [k for k in keys if "{" in k], keys
        assert r.hget(f"{fleet.namespace}:catalog", "ext_fleet_test_add") is not None
        assert b'"group"' not in r.hget(f"{fleet.namespace}:catalog", "ext_fleet_test_add")
    finally:
        r.close()
