"""Dramatiq's maintenance, run on demand: messages of dead brokers go back to their queue."""

from __future__ import annotations

import time

from dramatiq.brokers.redis import RedisBroker

__all__ = ["run_maintenance"]


def run_maintenance(broker: RedisBroker, queue: str) -> None:
    """Run Dramatiq's dispatch script with maintenance forced on (a read-only ``qsize``)."""
    broker.scripts["dispatch"](
        keys=[broker.namespace],
        args=[
            "qsize", int(time.time() * 1000), queue, broker.broker_id, broker.heartbeat_timeout,
            broker.dead_message_ttl, 1, broker._max_unpack_size(),  # type: ignore[no-untyped-call]
        ],
    )  # fmt: skip
