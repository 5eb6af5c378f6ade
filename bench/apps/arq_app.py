"""arq worker settings: ``arq arq_app.WorkerSettings`` (one process each).

arq polls: its queue every ``poll_delay`` (default 0.5 s) and a job's result every
``poll_delay`` of ``Job.result`` (default 0.5 s). Both are set to 10 ms here (the
producer side in ``driver.py``), as a user who cares about latency would.
"""

from __future__ import annotations

import os
from typing import Any

from arq.connections import RedisSettings

URL = os.environ["BENCH_REDIS_URL"]
POLL_DELAY_S = 0.01


async def noop(ctx: dict[str, Any], n: int) -> int:
    return n


async def _ready(ctx: dict[str, Any]) -> None:
    await ctx["redis"].sadd("bench:ready", os.getpid())


class WorkerSettings:
    functions = [noop]
    redis_settings = RedisSettings.from_dsn(URL)
    poll_delay = POLL_DELAY_S
    on_startup = _ready
