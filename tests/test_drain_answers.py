"""The end of a SIGTERM drain: every call the process still holds gets its reply."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import redis
from tenancy_tools import record_key

from conftest import start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared.wire import Status

TALLY = "ext_tenancy_test_tally"


def test_a_drain_out_of_grace_answers_running_calls_crashed_and_re_serves_waiting_ones(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    ns = f"{namespace}-{uuid.uuid4().hex[:6]}"
    env = {"TOOLFLEET_SHUTDOWN_GRACE_S": "1"}
    extra = ["--extension", "tenancy_tools:extension"]
    r = redis.Redis.from_url(redis_url)
    started_key = record_key(ns, "tally_started")
    finished_key = record_key(ns, "tally_finished")
    fleet = start_fleet(redis_url, ns, tmp_path / "first.log", processes=1, threads=4, extra=extra,
                        env=env)  # fmt: skip
    second = None
    try:
        with ToolClient(redis_url, namespace=ns) as tc:
            # Given a call running longer than the drain's grace (its deadline 90 s away)
            slow = tc.submit(TALLY, {"seconds": 40}, timeout_s=90)
            deadline = time.monotonic() + 20
            while not r.hlen(started_key) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert r.hlen(started_key) == 1, fleet.log()
            # And calls fetched by the same process that wait for the tool's one slot
            waiting = [tc.submit(TALLY, {"seconds": 0.05}, timeout_s=90) for _ in range(3)]
            time.sleep(1.0)
            assert r.hlen(started_key) == 1  # they have not started
            # When the worker is stopped with SIGTERM
            stopped_at = time.monotonic()
            fleet.stop()
            # Then the running call is answered crashed before its process exits (not at
            # its deadline, 90 s on)
            result = slow.result(timeout=1)
            assert result.status is Status.CRASHED, result.content
            assert time.monotonic() - stopped_at < 30
            # And the calls that had not started are served once by the next process
            second = start_fleet(redis_url, ns, tmp_path / "second.log", processes=1,
                                 threads=4, extra=extra, env=env)  # fmt: skip
            results = [future.result(timeout=60) for future in waiting]
            assert [res.status for res in results] == [Status.OK] * 3, [
                res.content for res in results
            ]
            assert {res.id for res in results} <= {k.decode() for k in r.hkeys(finished_key)}
            assert r.hlen(started_key) == 4  # each ran once; the slow one never again
    finally:
        fleet.stop()
        if second is not None:
            second.stop()
        for key in r.scan_iter(match=f"{ns}*", count=1000):
            r.delete(key)
        r.close()
