"""Switches and quotas on a Redis Cluster: one fleet copy, and one in each queue group's slot.

A claim reads the switches hash and an enqueue the limits hash inside their scripts, and
a script runs in one slot: on a cluster each queue group keeps its own copy of both,
under its hash tag, beside the fleet copy (``<ns>:{fleet}:switches``, ``...:limits``) that
people and producers read. ``toolfleet switch`` and ``toolfleet limits`` write the fleet
copy and the copy of every group the catalog names, one after the other (not in one
transaction: a call admitted between two writes sees the old state); a worker process
copies the fleet's into its group's at start, so a group started later has them too, and
again when the group's copy is gone (its master lost its data; checked every few
heartbeats by :func:`restore_group_copy`).
Quota usage is counted per group (docs/cluster.md). On a plain Redis there is one copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from toolfleet.shared.catalog import CatalogEntry, entry_group
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.naming import (
    catalog_key,
    fleet_namespace,
    group_namespace,
    limits_key,
    settings_copied_key,
    switches_key,
)

__all__ = [
    "SETTINGS_KEYS",
    "copy_to_group",
    "fleet_copy",
    "hdel_everywhere",
    "hset_everywhere",
    "restore_group_copy",
]

#: The hashes kept in every group: switches and quotas.
SETTINGS_KEYS: tuple[Callable[[str], str], ...] = (switches_key, limits_key)


def fleet_copy(client: Any, namespace: str) -> str:
    """The key prefix of the fleet copy: ``<ns>:{fleet}`` on a cluster, else ``namespace``."""
    return fleet_namespace(namespace, cluster=is_cluster(client))


def _copies(client: Any, namespace: str) -> list[str]:
    """The fleet copy's prefix, then every catalogued group's (a cluster), or ``[namespace]``."""
    if not is_cluster(client):
        return [namespace]
    groups = set()
    for raw in client.hvals(catalog_key(fleet_copy(client, namespace))):
        try:
            groups.add(entry_group(CatalogEntry.model_validate_json(raw)))
        except ValueError:
            continue
    group_prefixes = [group_namespace(namespace, g, cluster=True) for g in sorted(groups)]
    return [fleet_copy(client, namespace), *group_prefixes]


def hset_everywhere(
    client: Any, key: Callable[[str], str], namespace: str, field: str, value: str
) -> None:
    """``HSET key field value`` in the fleet copy and every group's.

    Args:
        client: a ``redis.Redis`` or ``RedisCluster``.
        key: :func:`~toolfleet.shared.naming.switches_key` or ``limits_key``.
        namespace: the deployment's namespace.
        field: the switch name or quota scope.
        value: its state or JSON quota.

    Raises:
        redis.RedisError: Redis failed (the copies written before stay written).
    """
    for prefix in _copies(client, namespace):
        client.hset(key(prefix), field, value)


def hdel_everywhere(client: Any, key: Callable[[str], str], namespace: str, field: str) -> bool:
    """``HDEL`` ``field`` from every copy; whether the fleet copy had it.

    Raises:
        redis.RedisError: Redis failed.
    """
    had = [bool(client.hdel(key(prefix), field)) for prefix in _copies(client, namespace)]
    return had[0]


def copy_to_group(client: Any, group_prefix: str) -> None:
    """Write the fleet copy's switches and quotas into the group ``group_prefix`` names.

    Nothing on a plain Redis (the group's copy is the fleet's).

    Raises:
        redis.RedisError: Redis failed.
    """
    fleet = fleet_namespace(group_prefix)
    if fleet == group_prefix:
        return
    for key in SETTINGS_KEYS:
        values = client.hgetall(key(fleet))
        if values:
            client.hset(key(group_prefix), mapping=values)
    client.set(settings_copied_key(group_prefix), "1")


def restore_group_copy(client: Any, group_prefix: str) -> bool:
    """Copy the fleet's switches and quotas into the group again if the group's copy is gone.

    The group's marker (:func:`~toolfleet.shared.naming.settings_copied_key`) is missing
    only when its master lost its data (or before the first copy): then the copy is written
    as at a worker's start. One ``EXISTS`` otherwise; nothing on a plain Redis.

    Returns:
        Whether the copy was written again.

    Raises:
        redis.RedisError: Redis failed.
    """
    if fleet_namespace(group_prefix) == group_prefix or client.exists(
        settings_copied_key(group_prefix)
    ):
        return False
    copy_to_group(client, group_prefix)
    return True
