"""Which key prefix a producer's keys use: one namespace, or a queue group's on a cluster.

The layout itself is :class:`toolfleet.shared.layout.KeyLayout` (the one rule, shared
with workers and the CLI); a client adds its reply lists: on a cluster, one per queue
group it sends calls to, in that group's slot (a call's outcome and reply are written by
one script in the group's slot).
"""

from __future__ import annotations

from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.naming import reply_key

__all__ = ["KeySpace"]


class KeySpace(KeyLayout):
    """The key prefixes of one client, and the reply lists it handed out.

    Args:
        namespace: the deployment's namespace.
        cluster: whether Redis is a cluster.
        client_id: the client's id (its reply lists are named by it).
    """

    def __init__(self, namespace: str, cluster: bool, client_id: str) -> None:
        super().__init__(namespace, cluster)
        self.client_id = client_id
        self._replying: set[str] = set()

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
