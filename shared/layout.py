"""Where each key family of one deployment lives: the fleet's slot and each queue group's.

The naming rule is :func:`toolfleet.shared.naming.group_namespace` and
:func:`~toolfleet.shared.naming.fleet_namespace`; this module applies it for a reader or
writer that meets many queues, functions and groups (producers, the CLI, the exporter,
the ops page, the MCP gateway, workers):

- fleet-wide keys (catalog, epoch, recovering set, liveness, worker heartbeats,
  extension errors, MCP states, the fleet copy of switches and limits) under
  :attr:`KeyLayout.fleet`;
- every key of one queue (its Dramatiq keys, lanes, dead letters) and of the calls and
  functions served on it (claims, outcomes, cancel markers, reply lists, breakers,
  concurrency slots, quota counters, idempotency records, conversation routes, the
  events stream, the group's copies of switches and limits) under the prefix of the
  queue's group, :meth:`KeyLayout.of_queue`.

On a plain Redis both are the namespace: nothing here changes a key name there. The group
of a queue is what its workers name in their catalog entries (:func:`entry_group`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from toolfleet.shared.catalog import entry_group
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.naming import (
    DEFAULT_GROUP,
    SLOT_INFIX,
    fleet_base,
    fleet_namespace,
    group_namespace,
)

__all__ = ["KeyLayout"]


class KeyLayout:
    """The key prefixes of one deployment on one Redis (thread-safe).

    Args:
        namespace: the deployment's namespace (``TOOLFLEET_NAMESPACE``); a group's or the
            fleet's prefix stands for the namespace it was made from.
        cluster: whether Redis is a cluster.

    Attributes:
        namespace: the deployment's namespace, without a hash tag.
        cluster: as given.
        fleet: the prefix of fleet-wide keys: ``<ns>:{fleet}`` on a cluster, else ``<ns>``.
    """

    def __init__(self, namespace: str, cluster: bool) -> None:
        self.namespace, self.cluster = fleet_base(namespace), cluster
        self.fleet = fleet_namespace(self.namespace, cluster=cluster)
        self._groups: dict[str, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, client: object, namespace: str) -> KeyLayout:
        """The layout for ``client``'s Redis (a cluster client: the cluster layout)."""
        return cls(namespace, is_cluster(client))

    def learn(self, entries: Mapping[str, Mapping[str, Any]]) -> None:
        """Remember the group of every queue the catalog ``entries`` (as read) name.

        Args:
            entries: function name -> catalog entry (decoded JSON, ``queue`` and, on a
                cluster, ``group``).
        """
        if not self.cluster:
            return
        found = {str(e.get("queue")): entry_group(e) for e in entries.values()}
        with self._lock:
            self._groups.update(found)

    def group(self, group: str) -> str:
        """The prefix of queue group ``group``'s keys (the namespace on a plain Redis)."""
        return group_namespace(self.namespace, group, cluster=self.cluster)

    def of_queue(self, queue: str) -> str:
        """The prefix of ``queue``'s keys and of its calls' and functions' keys.

        A session-affinity slot queue (:func:`~toolfleet.shared.naming.affinity_queue_for`)
        is in the group of the queue it stands in for. A queue no catalog entry learnt so
        far names is taken to be of :data:`~toolfleet.shared.naming.DEFAULT_GROUP`.
        """
        if not self.cluster:
            return self.namespace
        with self._lock:
            group = self._groups.get(queue)
            if group is None:
                bases = [q for q in self._groups if queue.startswith(q + SLOT_INFIX)]
                group = self._groups[max(bases, key=len)] if bases else DEFAULT_GROUP
        return self.group(group)

    def prefixes(self) -> list[str]:
        """Every group prefix known (with the default group's), sorted; ``[namespace]`` plain."""
        if not self.cluster:
            return [self.namespace]
        with self._lock:
            groups = set(self._groups.values()) | {DEFAULT_GROUP}
        return sorted(self.group(g) for g in groups)
