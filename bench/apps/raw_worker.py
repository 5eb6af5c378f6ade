"""The floor: a hand-written queue. Workers ``BRPOP`` requests and ``LPUSH`` replies.

Request ``{"id", "n", "reply_to"}`` on list ``raw:q``; reply ``{"id", "result"}`` on
the producer's list. No acks, no validation, no deadlines: the least a queue does.
"""

from __future__ import annotations

import os
import signal
import sys

import orjson
import redis

QUEUE = "raw:q"


def noop(n: int) -> int:
    return n


def main() -> int:
    client = redis.Redis.from_url(os.environ["BENCH_REDIS_URL"])
    stop = False

    def handler(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    client.sadd("bench:ready", os.getpid())
    while not stop:
        item = client.brpop([QUEUE], timeout=1)
        if item is None:
            continue
        request = orjson.loads(item[1])
        reply = orjson.dumps({"id": request["id"], "result": noop(request["n"])})
        client.lpush(request["reply_to"], reply)
    return 0


if __name__ == "__main__":
    sys.exit(main())
