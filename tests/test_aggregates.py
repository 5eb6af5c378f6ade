"""Per-minute call aggregates: counted in memory, written in one pipeline, read back by range."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from private_redis import command_counts
from toolfleet.shared.aggregates import (
    BUCKETS_S,
    MAX_FIELDS_PER_CELL,
    OTHER_FIELD,
    Accumulator,
    Histogram,
    read_window,
    write,
)
from toolfleet.shared.metric_labels import (
    NO_MODEL_LABEL,
    OTHER_MODEL_LABEL,
    UNDECLARED_FIELD_LABEL,
    field_label,
    model_label,
)
from toolfleet.shared.naming import aggregates_key

T0 = 1_800_000_000.0  # a minute boundary (divisible by 60)
FN = "ext_x_add"


@pytest.fixture
def ns(r: redis.Redis) -> Iterator[str]:
    name = f"agg-{uuid.uuid4().hex[:8]}"
    yield name
    keys = list(r.scan_iter(match=f"{name}:*"))
    if keys:
        r.delete(*keys)


def _flush(r: redis.Redis, ns: str, acc: Accumulator, ttl_s: int = 600) -> int:
    pipe = r.pipeline(transaction=False)
    queued = write(pipe, ns, acc.drain(), ttl_s)
    pipe.execute()
    return queued


def test_counts_of_two_workers_add_up_per_minute_with_their_fields(r: redis.Redis, ns: str) -> None:
    """Two processes' counts land in the same minute hashes and read back summed, per minute."""
    one, two = Accumulator(), Accumulator()
    for _ in range(3):
        one.record(FN, "m1", "ok", queued_s=0.002, run_s=0.02, at_s=T0 + 1)
    two.record(FN, "m1", "invalid_arguments", queued_s=0.002, problems=[("a", "missing")],
               at_s=T0 + 59)  # fmt: skip
    two.record(FN, "m2", "ok", run_s=0.7, at_s=T0 + 61)
    _flush(r, ns, one)
    _flush(r, ns, two)

    window = read_window(r, ns, since_s=T0, until_s=T0 + 120)

    assert [m.start_s for m in window.minutes] == [int(T0), int(T0) + 60]
    first = window.minutes[0].cells[(FN, "m1")]
    assert first.statuses == {"ok": 3, "invalid_arguments": 1}
    assert first.fields == {("a", "missing"): 1}
    assert first.wait.count == 4 and first.run.count == 3
    assert window.minutes[1].cells[(FN, "m2")].statuses == {"ok": 1}
    first_minute = window.minutes[0].by_function()[FN]
    assert first_minute.statuses == {"ok": 3, "invalid_arguments": 1}
    assert first_minute.run.count == 3
    totals = window.totals()
    assert [(c.function, c.model) for c in totals] == [(FN, "m1"), (FN, "m2")]  # worst first
    assert totals[0].rate("invalid_arguments") == 0.25


def test_percentiles_come_from_the_fixed_buckets_summed_across_minutes(
    r: redis.Redis, ns: str
) -> None:
    """p50/p95 are read from bucket counts added over minutes (interpolated inside a bucket)."""
    acc = Accumulator()
    for i in range(90):  # 90 calls in the bucket (0.01995, 0.02113], 10 in (0.8913, 0.9441]
        acc.record(FN, "m", "ok", run_s=0.02, at_s=T0 + (i % 3) * 60)
    for _ in range(10):
        acc.record(FN, "m", "ok", run_s=0.9, at_s=T0 + 120)
    _flush(r, ns, acc)

    (cell,) = read_window(r, ns, since_s=T0, until_s=T0 + 180).totals()

    assert cell.run.count == 100
    # bounds 10^(-68/40), 10^(-67/40) and 10^(-2/40), 10^(-1/40) to four digits:
    # rank 50 of 90 in the first bucket, rank 95 the 5th of 10 in the second
    assert cell.run.quantile(0.5) == pytest.approx(0.01995 + (0.02113 - 0.01995) * 50 / 90)
    assert cell.run.quantile(0.95) == pytest.approx(0.8913 + (0.9441 - 0.8913) * 5 / 10)
    assert cell.run.mean_s == pytest.approx((90 * 0.02 + 10 * 0.9) / 100)
    assert cell.wait.quantile(0.5) is None


def test_overflow_bucket_reports_the_last_bound() -> None:
    """A value past the last bucket bound is counted and reported as that bound."""
    histogram = Histogram()
    histogram.counts[len(BUCKETS_S)] = 1
    assert histogram.quantile(0.99) == BUCKETS_S[-1]


def test_reading_costs_one_hgetall_per_minute_whatever_the_call_volume(
    counting_server: Any,
) -> None:
    """Writing 10 or 5,000 calls costs the same commands; reading 10 minutes is 10 HGETALLs."""
    client = redis.Redis.from_url(counting_server.url)
    costs = []
    for calls in (10, 5000):
        acc = Accumulator()
        for i in range(calls):
            acc.record(FN, "m", "ok" if i % 2 else "tool_error", queued_s=0.003, run_s=0.04,
                       at_s=T0 + 5)  # fmt: skip
        client.config_resetstat()
        _flush(client, f"ns{calls}", acc)
        costs.append(command_counts(client))
    assert costs[0] == costs[1]
    assert costs[0]["hincrby"] == 2 + 2 + 2 and costs[0]["expire"] == 1  # c x2, w, ws, r, rs

    client.config_resetstat()
    window = read_window(client, "ns5000", since_s=T0 - 540, until_s=T0 + 5)
    assert command_counts(client) == {"hgetall": 10}
    assert window.totals()[0].calls == 5000
    client.close()


def test_each_minute_hash_expires_after_the_ttl(r: redis.Redis, ns: str) -> None:
    """Every minute's hash gets the TTL it was written with."""
    acc = Accumulator()
    acc.record(FN, "m", "ok", at_s=T0)
    _flush(r, ns, acc, ttl_s=300)
    assert 290 <= r.ttl(aggregates_key(ns, int(T0))) <= 300


def test_distinct_failing_fields_are_bounded_per_cell() -> None:
    """Past the cap, invented argument names count as one ``(other)`` field."""
    acc = Accumulator()
    for i in range(MAX_FIELDS_PER_CELL + 5):
        acc.record(FN, "m", "invalid_arguments", problems=[(f"made_up_{i}", "extra")], at_s=T0)
    fields = [k for k in acc.drain()[int(T0)] if k[0] == "f"]
    assert len(fields) == MAX_FIELDS_PER_CELL + 1
    assert ("f", FN, "m", OTHER_FIELD, "extra") in fields


def test_restore_puts_back_what_could_not_be_written() -> None:
    """Counts drained for a failed beat are added back to what accumulated since."""
    acc = Accumulator()
    acc.record(FN, "m", "ok", at_s=T0)
    lost = acc.drain()
    acc.record(FN, "m", "ok", at_s=T0)
    acc.restore(lost)
    assert acc.drain()[int(T0)][("c", FN, "m", "ok")] == 2


def test_model_label_is_bounded_by_the_allow_list() -> None:
    """Listed models keep their name; others are ``other``; no model is ``none``."""
    allowed = frozenset({"openai/gpt-4o"})
    assert model_label("openai/gpt-4o", allowed) == "openai/gpt-4o"
    assert model_label("openai/gpt-4o-mini", allowed) == OTHER_MODEL_LABEL
    assert model_label(None, allowed) == NO_MODEL_LABEL
    assert model_label(["x"], allowed) == OTHER_MODEL_LABEL


def test_field_label_is_bounded_by_the_tools_schema() -> None:
    """A declared argument keeps its name (top level); any other name is ``(undeclared)``."""
    assert field_label("items.*.qty", {"items"}) == "items"
    assert field_label("(arguments)", {"items"}) == "(arguments)"
    assert field_label("radius_cm", {"items"}) == UNDECLARED_FIELD_LABEL
