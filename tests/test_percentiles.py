"""Aggregated percentiles are within 10 % of the true ones at 1 ms, 50 ms and 2 s."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import wait
from pathlib import Path

import pytest
import redis

from conftest import start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared import Status
from toolfleet.shared.aggregates import Accumulator, read_window, write
from toolfleet.shared.buckets import PROMETHEUS_BUCKETS_S
from toolfleet.worker.supervision.metrics import CALL_DURATION, QUEUE_WAIT

T0 = 1_800_000_000.0
SLEEP = "ext_fleet_test_sleep"


@pytest.fixture
def ns(r: redis.Redis) -> Iterator[str]:
    name = f"pct-{uuid.uuid4().hex[:8]}"
    yield name
    keys = list(r.scan_iter(match=f"{name}:*"))
    if keys:
        r.delete(*keys)


# Each tool's 200 run times climb evenly from its nominal time to 3 % above it (what a
# sleep's overhead looks like): p50 is nominal x 1.015, p95 nominal x 1.0285.
@pytest.mark.parametrize(
    ("nominal_s", "true_p50_s", "true_p95_s"),
    [(0.001, 0.001015, 0.0010285), (0.050, 0.05075, 0.051425), (2.0, 2.03, 2.057)],
)
def test_synthetic_run_times_read_back_within_ten_percent(
    r: redis.Redis, ns: str, nominal_s: float, true_p50_s: float, true_p95_s: float
) -> None:
    """200 known run times and waits of one tool: the aggregates' p50 and p95 are within
    10 % of the true values (the coarse buckets read a 50 ms tool as 75 ms)."""
    acc = Accumulator()
    for i in range(200):
        value = nominal_s * (1 + 0.03 * i / 199)
        acc.record("ext_t_x", "m", "ok", queued_s=value, run_s=value, at_s=T0 + i % 120)
    pipe = r.pipeline(transaction=False)
    write(pipe, ns, acc.drain(), 600)
    pipe.execute()

    (cell,) = read_window(r, ns, since_s=T0, until_s=T0 + 180).totals()

    for histogram in (cell.run, cell.wait):
        p50, p95 = histogram.quantile(0.5), histogram.quantile(0.95)
        assert p50 is not None and p95 is not None
        assert abs(p50 - true_p50_s) <= 0.1 * true_p50_s, (nominal_s, p50)
        assert abs(p95 - true_p95_s) <= 0.1 * true_p95_s, (nominal_s, p95)


def test_a_minute_hash_holds_only_the_buckets_that_counted(r: redis.Redis, ns: str) -> None:
    """Finer buckets cost no memory where no call fell: 1,000 calls of a steady 50 ms tool
    fill at most 3 run-time buckets of its minute hash."""
    acc = Accumulator()
    for i in range(1000):
        acc.record("ext_t_x", "m", "ok", run_s=0.05 + 0.002 * (i % 2), at_s=T0)
    pipe = r.pipeline(transaction=False)
    write(pipe, ns, acc.drain(), 600)
    pipe.execute()
    fields = [json.loads(k) for k in r.hkeys(f"{ns}:agg:{int(T0)}")]
    assert 1 <= len([f for f in fields if f[0] == "rl"]) <= 3, fields


def test_prometheus_buckets_are_bounds_of_the_aggregates() -> None:
    """The histograms the dashboard reads end their buckets where the aggregates do, 1 ms
    to 100 s, at most 12.3 % apart (so its histogram_quantile is never a bucket of 2.5x)."""
    from toolfleet.shared.aggregates import BUCKETS_S

    assert PROMETHEUS_BUCKETS_S[0] == 0.001 and PROMETHEUS_BUCKETS_S[-1] == 100.0
    assert set(PROMETHEUS_BUCKETS_S) <= set(BUCKETS_S)
    ratios = [b / a for a, b in zip(PROMETHEUS_BUCKETS_S, PROMETHEUS_BUCKETS_S[1:], strict=False)]
    assert max(ratios) < 1.123
    for metric in (CALL_DURATION, QUEUE_WAIT):
        assert tuple(metric._upper_bounds[:-1]) == PROMETHEUS_BUCKETS_S  # noqa: SLF001


def test_a_real_fleet_running_a_50_ms_sleep_reads_p50_within_ten_percent(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A real fleet runs a 50 ms sleep tool 40 times: the ops page's aggregates and
    ``toolfleet quality`` read its p50 run time within 10 % of 50 ms."""
    ns = f"{namespace}-pct-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(redis_url, ns, tmp_path / "worker.log", processes=1, threads=4)
    try:
        with ToolClient(redis_url, namespace=ns) as client:
            futures = [client.submit(SLEEP, {"seconds": 0.05}, timeout_s=60) for _ in range(40)]
            wait(futures, timeout=90)
            assert all(f.result().status is Status.OK for f in futures)
        r = redis.Redis.from_url(redis_url)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            cells = read_window(r, ns, since_s=time.time() - 600).totals(function=SLEEP)
            if cells and cells[0].run.count >= 40:
                break
            time.sleep(0.3)
        (cell,) = cells
        p50 = cell.run.quantile(0.5)
        assert p50 is not None and abs(p50 - 0.05) <= 0.005, p50
        out = subprocess.run(
            [toolfleet_command(), "quality", "--since", "10m", "--format", "json",
             "--tool", SLEEP],
            env={**os.environ, "TOOLFLEET_REDIS_URL": redis_url, "TOOLFLEET_NAMESPACE": ns},
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        (row,) = json.loads(out.stdout)["rows"]
        assert abs(row["run_p50_s"] - 0.05) <= 0.005, row
        print(f"\n50 ms sleep tool: aggregates p50 {p50 * 1000:.2f} ms, "
              f"p95 {cell.run.quantile(0.95) * 1000:.2f} ms")  # fmt: skip
    finally:
        fleet.stop()
