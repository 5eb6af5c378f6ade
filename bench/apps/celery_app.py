"""Celery with the Redis broker and result backend, stock settings.

``celery -A celery_app worker -c N -P prefork``.
"""

from __future__ import annotations

import os

import redis
from celery import Celery
from celery.signals import worker_process_init

URL = os.environ["BENCH_REDIS_URL"]

app = Celery("bench", broker=URL, backend=URL)
app.conf.broker_connection_retry_on_startup = True


@worker_process_init.connect
def _ready(**_: object) -> None:
    redis.Redis.from_url(URL).sadd("bench:ready", os.getpid())


@app.task
def noop(n: int) -> int:
    return n
