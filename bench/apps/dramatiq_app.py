"""Dramatiq + Results (Redis backend), stock settings: ``dramatiq dramatiq_app -p N``."""

from __future__ import annotations

import os

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

URL = os.environ["BENCH_REDIS_URL"]


class Ready(Middleware):
    """Announces a booted worker process on ``bench:ready`` (the benchmark waits for it)."""

    def after_worker_boot(self, broker, worker):  # type: ignore[no-untyped-def]
        redis.Redis.from_url(URL).sadd("bench:ready", os.getpid())


broker = RedisBroker(url=URL)
backend = RedisBackend(url=URL)
broker.add_middleware(Results(backend=backend))
broker.add_middleware(Ready())
dramatiq.set_broker(broker)


@dramatiq.actor(store_results=True)
def noop(n: int) -> int:
    return n
