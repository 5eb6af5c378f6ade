"""Which key prefix a producer's keys use: one namespace, or a queue group's on a cluster.

On a plain Redis every prefix is the namespace and nothing here changes a key. On a Redis
Cluster a call's keys (its queue, lanes, quotas, breaker, outcome, cancel marker and the
client's reply list for that group) are under its queue group's hash tag, and the
catalog, heartbeats, switches and quotas people set are read from the fleet copy
(:mod:`toolfleet.shared.naming`, docs/cluster.md). The group of a queue comes from the
catalog entries its workers publish.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from toolfleet.shared.catalog import entry_group
from toolfleet.shared.naming import (
    DEFAULT_GROUP,
    fleet_namespace,
    group_namespace,
    reply_key,
)

__all__ = ["KeySpace"]


class KeySpace:
    """The key prefixes of one client.

    Args:
        namespace: the deployment's namespace.
        cluster: whether Redis is a cluster.
        client_id: the client's id (its reply lists are named by it).

    Attributes:
        fleet: the prefix of fleet-wide keys (``namespace`` on a plain Redis).
    """

    def __init__(self, namespace: str, cluster: bool, client_id: str) -> None:
        self.namespace, self.cluster, self.client_id = namespace, cluster, client_id
        self.fleet = fleet_namespace(namespace, cluster=cluster)
        self._groups: dict[str, str] = {}
        self._replying: set[str] = set()
        self._lock = threading.Lock()

    def learn(self, entries: Mapping[str, Mapping[str, Any]]) -> None:
        """Remember the group of every queue the catalog ``entries`` (as read) name."""
        if not self.cluster:
            return
        found = {str(e.get("queue")): entry_group(e) for e in entries.values()}
        with self._lock:
            self._groups.update(found)

    def of_queue(self, queue: str) -> str:
        """The prefix of ``queue``'s keys and its calls' keys."""
        if not self.cluster:
            return self.namespace
        with self._lock:
            group = self._groups.get(queue, DEFAULT_GROUP)
        return group_namespace(self.namespace, group, cluster=True)

    def reply_to(self, queue: str) -> str:
        """The client's reply list for calls on ``queue`` (one per group on a cluster).

        Each list handed out is remembered (:meth:`reply_lists`): the client listens on it.
        """
        key = reply_key(self.of_queue(queue), self.client_id)
        with self._lock:
            self._replying.add(key)
        return key

    def reply_lists(self) -> set[str]:
        """Every reply list :meth:`reply_to` handed out."""
        with self._lock:
            return set(self._replying)

    def prefixes(self) -> list[str]:
        """Every group prefix known (the namespace alone on a plain Redis), sorted."""
        if not self.cluster:
            return [self.namespace]
        with self._lock:
            groups = set(self._groups.values()) | {DEFAULT_GROUP}
        return sorted(group_namespace(self.namespace, g, cluster=True) for g in groups)
