"""How the ops page writes times and a worker's queues (its template filters)."""

from __future__ import annotations

import pytest

from toolfleet.ui.views import FILTERS


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "–"),
        (0.0, "0 µs"),
        (0.000042, "42 µs"),
        (0.0005, "500 µs"),
        (0.00095, "950 µs"),
        (0.0009996, "1 ms"),  # rounds to 1000 µs: written as 1 ms
        (0.0123, "12 ms"),
        (0.9996, "1.0 s"),
        (2.25, "2.2 s"),
    ],
)
def test_times_under_a_millisecond_are_written_in_microseconds(
    seconds: float | None, shown: str
) -> None:
    """A run time under 1 ms reads in µs (``500 µs``), not as ``0 ms`` or ``1 ms``."""
    assert FILTERS["seconds"](seconds) == shown


def test_a_workers_slot_queues_are_counted_after_their_queue() -> None:
    """Slot queues (session affinity) are summed up after their queue, in the queues' order."""
    queues = [
        "tools.bfcl",
        "tools.python",
        "tools.python.slot.vm-18091-0",
        "tools.python.slot.vm-18091-1",
        "tools.session.slot.vm-18091-0",
        "tools.session",
    ]
    summary = FILTERS["queue_summary"](queues)
    assert summary == ["tools.bfcl", "tools.python (+2 slots)", "tools.session (+1 slot)"]
    assert FILTERS["queue_summary"]([]) == []


def test_names_may_wrap_after_each_underscore_and_stay_escaped() -> None:
    """Function and status names get a line-break opportunity after each ``_``; text is
    escaped."""
    assert str(FILTERS["breakable"]("ext_a_b")) == "ext_<wbr>a_<wbr>b"
    assert str(FILTERS["breakable"]("x<y>_z")) == "x&lt;y&gt;_<wbr>z"
