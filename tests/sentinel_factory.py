"""A ``--redis-client`` factory for the Sentinel tests: the master of the test's sentinel.

The sentinel's port and service name come from the test (``TFTEST_SENTINEL_PORT`` and
``TFTEST_SENTINEL_SERVICE``); this is the shape an operator's own factory takes.
"""

from __future__ import annotations

import os

import redis
from redis.sentinel import Sentinel


def master() -> redis.Redis:
    """The current master of the test's Sentinel service."""
    port = int(os.environ["TFTEST_SENTINEL_PORT"])
    sentinel = Sentinel([("127.0.0.1", port)], socket_timeout=5, socket_connect_timeout=2)
    return sentinel.master_for(os.environ["TFTEST_SENTINEL_SERVICE"])
