"""Per-call metrics kept in memory: a flush writes what each call's own writes would have."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from toolfleet.worker.supervision.metrics import Tally


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    }


def test_a_flush_writes_the_same_samples_as_a_write_per_call() -> None:
    """Counts and histogram buckets, sums and counts after one flush equal those written one
    call at a time (values on a bound, between bounds and past the last one)."""
    values = [0.0, 0.005, 0.3, 1.0, 1.0, 2.5, 7.0, 99.0]
    direct, tallied = CollectorRegistry(), CollectorRegistry()
    calls = {r: Counter("calls", "c", ["f"], registry=r) for r in (direct, tallied)}
    runs = {r: Histogram("run_s", "h", ["f"], buckets=(0.005, 1.0, 2.5, 5.0), registry=r)
            for r in (direct, tallied)}  # fmt: skip
    tally = Tally()
    for value in values:
        calls[direct].labels("f1").inc()
        runs[direct].labels("f1").observe(value)
        tally.inc(calls[tallied], ("f1",))
        tally.observe(runs[tallied], ("f1",), value)
    assert ("calls_total", (("f", "f1"),)) not in _samples(tallied)  # nothing before a flush
    tally.flush()
    assert _samples(tallied) == _samples(direct)
    tally.flush()  # nothing accumulated: nothing written twice
    assert _samples(tallied) == _samples(direct)
