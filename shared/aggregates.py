"""Per-minute call aggregates in Redis: what the quality report and the ops page read.

Every worker process counts the calls it answers in memory (:class:`Accumulator`, O(1)
per call, no Redis) and adds what accumulated to Redis at heartbeat time, in the
heartbeat's one pipeline (:func:`write`). Readers get any time range back with one
pipelined round trip of at most one ``HGETALL`` per minute in it (:func:`read_window`),
whatever the call volume: the counts of every worker land in the same per-minute hash.

Keys (``ns`` is the namespace; built by :func:`toolfleet.shared.naming.aggregates_key`)::

    <ns>:agg:<minute>    hash, one per minute; <minute> is the minute's start, epoch
                         seconds (a multiple of 60); expires ``aggregates_ttl_s`` after
                         the last write to it

Hash fields are JSON arrays (any text inside stays unambiguous), values integers
added with ``HINCRBY``:

    ["c", function, model, status]           calls answered with that status
    ["wl", function, model, bucket]          calls whose queue wait fell in bucket ``bucket``
    ["rl", function, model, bucket]          calls whose run time fell in bucket ``bucket``
    ["ws", function, model] / ["rs", ...]    the sum of the waits / run times, microseconds
    ["f", function, model, field, reason]    invalid arguments: a failing field and why

``function`` is a label (:func:`toolfleet.shared.metric_labels.function_label`: a served
name, else ``unknown``), ``model`` the bounded model label
(:func:`toolfleet.shared.metric_labels.model_label`), ``bucket`` an index into
:data:`BUCKETS_S` (``len(BUCKETS_S)`` is the overflow bucket), ``reason`` one of
:data:`REASONS`. Buckets are fixed, so histograms add across minutes and workers and
percentiles are computed on the sum (:meth:`Histogram.quantile`). They are log-spaced,
40 a decade (:mod:`toolfleet.shared.buckets`): a percentile read inside one is within
about 3 % of the true value at any scale. A minute's hash holds only the buckets that
counted a call: a tool of steady speed fills a handful, and no cell ever holds more than
``len(BUCKETS_S) + 1`` per histogram. (Fields ``"w"``/``"r"`` of the coarser buckets an
older version wrote are skipped by readers.)

Reader API::

    window = read_window(client, namespace, since_s=time.time() - 3600)
    for minute in window.minutes:            # Minute(start_s, cells), oldest first
        for cell in minute.cells.values():   # Cell: one function x model in that minute
            cell.statuses["ok"], cell.wait.quantile(0.95), cell.run.quantile(0.5)
        minute.by_function()                 # function -> Cell summed over models
    window.totals(model="gpt-4o")            # Cells summed over the range, worst first
    window.totals()[0].top_fields()          # [(field, reason, calls)], most first
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from toolfleet.shared import codec
from toolfleet.shared.buckets import AGGREGATE_BUCKETS_S
from toolfleet.shared.naming import aggregates_key

__all__ = [
    "BUCKETS_S",
    "MAX_FIELDS_PER_CELL",
    "MAX_WINDOW_MINUTES",
    "OTHER_FIELD",
    "REASONS",
    "Accumulator",
    "Cell",
    "Histogram",
    "Minute",
    "Pending",
    "Window",
    "minute_of",
    "read_window",
    "write",
]

#: Upper bounds of the wait and run-time buckets, seconds (a last bucket holds the rest):
#: 100 µs to 1,000 s, 40 a decade (:data:`toolfleet.shared.buckets.AGGREGATE_BUCKETS_S`).
BUCKETS_S: tuple[float, ...] = AGGREGATE_BUCKETS_S
#: Why an argument failed: left out, a wrong JSON type, not one of the allowed values,
#: not declared by the tool, another constraint (a range, a length, a pattern), the
#: arguments were not JSON, or not an object.
REASONS = ("missing", "wrong_type", "enum", "extra", "invalid", "not_json", "not_object")
#: Distinct failing fields one process keeps per function x model x minute; more count here.
OTHER_FIELD = "(other)"
MAX_FIELDS_PER_CELL = 16
#: Longest range :func:`read_window` reads, minutes (one day; older keys have expired).
MAX_WINDOW_MINUTES = 1440
_MAX_FIELD_CHARS = 64


def minute_of(at_s: float) -> int:
    """The start of the minute holding ``at_s``, epoch seconds (a multiple of 60)."""
    return int(at_s // 60) * 60


def _bucket(value_s: float) -> int:
    return bisect.bisect_left(BUCKETS_S, value_s)


# -- the writer side ------------------------------------------------------------------------

#: What accumulated: minute -> hash field (a tuple, see the module docstring) -> count.
Pending = dict[int, dict[tuple[str | int, ...], int]]


class Accumulator:
    """The calls one process answered since its last heartbeat, counted in memory.

    Thread-safe; :meth:`record` is O(1) (a lock, a few dict updates, a bisect over the
    fixed buckets: nine steps). Nothing here talks to Redis: :meth:`drain` hands what accumulated
    to :func:`write`, which adds it to the heartbeat's pipeline.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: Pending = {}
        #: distinct failing fields kept per function x model since the last drain
        self._fields: dict[tuple[str, str], int] = {}

    def record(
        self,
        function: str,
        model: str,
        status: str,
        *,
        queued_s: float | None = None,
        run_s: float | None = None,
        problems: Iterable[tuple[str, str]] = (),
        at_s: float | None = None,
    ) -> None:
        """Count one answered call.

        Args:
            function: the function label (a served name or ``unknown``).
            model: the bounded model label.
            status: the wire status value, e.g. ``"invalid_arguments"``.
            queued_s: seconds it waited in its queue, if known.
            run_s: seconds the tool ran, if it ran.
            problems: ``(field, reason)`` of each failing argument (``reason`` one of
                :data:`REASONS`); field names are cut to 64 characters, and past
                :data:`MAX_FIELDS_PER_CELL` distinct ones count as :data:`OTHER_FIELD`.
            at_s: when it was answered, epoch seconds (default: now).
        """
        minute = minute_of(time.time() if at_s is None else at_s)
        with self._lock:
            counts = self._pending.setdefault(minute, {})
            _add(counts, ("c", function, model, status), 1)
            if queued_s is not None and queued_s >= 0 and math.isfinite(queued_s):
                _add(counts, ("wl", function, model, _bucket(queued_s)), 1)
                _add(counts, ("ws", function, model), round(queued_s * 1e6))
            if run_s is not None and run_s >= 0 and math.isfinite(run_s):
                _add(counts, ("rl", function, model, _bucket(run_s)), 1)
                _add(counts, ("rs", function, model), round(run_s * 1e6))
            for name, reason in problems:
                self._problem(counts, function, model, name[:_MAX_FIELD_CHARS], reason)

    def _problem(
        self, counts: dict[tuple[str | int, ...], int], function: str, model: str, name: str,
        reason: str,
    ) -> None:  # fmt: skip
        key: tuple[str | int, ...] = ("f", function, model, name, reason)
        if key not in counts:
            kept = self._fields.get((function, model), 0)
            if kept >= MAX_FIELDS_PER_CELL:
                key = ("f", function, model, OTHER_FIELD, reason)
            else:
                self._fields[(function, model)] = kept + 1
        _add(counts, key, 1)

    def drain(self) -> Pending:
        """Take everything accumulated (the accumulator is empty after)."""
        with self._lock:
            pending, self._pending = self._pending, {}
            self._fields = {}
        return pending

    def restore(self, pending: Pending) -> None:
        """Put back what :meth:`drain` took and could not be written (Redis failed)."""
        with self._lock:
            for minute, counts in pending.items():
                mine = self._pending.setdefault(minute, {})
                for key, count in counts.items():
                    mine[key] = mine.get(key, 0) + count


def _add(counts: dict[tuple[str | int, ...], int], key: tuple[str | int, ...], n: int) -> None:
    counts[key] = counts.get(key, 0) + n


class _Pipeline(Protocol):
    def hincrby(self, name: str, key: str, amount: int = 1) -> Any: ...  # noqa: D102
    def expire(self, name: str, time: int) -> Any: ...  # noqa: D102


def write(pipe: _Pipeline, namespace: str, pending: Pending, ttl_s: int) -> int:
    """Queue the commands adding ``pending`` to Redis on ``pipe`` (the heartbeat's pipeline).

    One ``HINCRBY`` per distinct hash field and one ``EXPIRE`` per minute: bounded by
    functions x models x statuses x buckets, not by the number of calls.

    Args:
        pipe: a redis-py pipeline (or anything with ``hincrby`` and ``expire``).
        namespace: the key prefix.
        pending: what :meth:`Accumulator.drain` returned.
        ttl_s: seconds each minute's hash lives after this write.

    Returns:
        The number of commands queued.
    """
    queued = 0
    for minute, counts in pending.items():
        key = aggregates_key(namespace, minute)
        for fields, count in counts.items():
            pipe.hincrby(key, codec.dumps_str(list(fields)), count)
            queued += 1
        pipe.expire(key, ttl_s)
        queued += 1
    return queued


# -- the reader side ------------------------------------------------------------------------


@dataclass
class Histogram:
    """Counts per fixed bucket (:data:`BUCKETS_S`, plus the overflow bucket last).

    Attributes:
        counts: ``len(BUCKETS_S) + 1`` counts.
        sum_s: the sum of the values, seconds.
    """

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    sum_s: float = 0.0

    @property
    def count(self) -> int:
        """How many values were counted."""
        return sum(self.counts)

    def add(self, other: Histogram) -> None:
        """Add ``other``'s counts to these."""
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.sum_s += other.sum_s

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile (0 to 1) in seconds, or ``None`` when nothing was counted.

        Interpolated linearly inside the bucket holding it, as Prometheus'
        ``histogram_quantile`` does; a value in the overflow bucket is reported as the
        last bound (the last of :data:`BUCKETS_S`).
        """
        total = self.count
        if total == 0:
            return None
        rank = q * total
        seen = 0
        for index, n in enumerate(self.counts):
            if n and seen + n >= rank:
                if index == len(BUCKETS_S):
                    return BUCKETS_S[-1]
                low = BUCKETS_S[index - 1] if index else 0.0
                return low + (BUCKETS_S[index] - low) * max(0.0, rank - seen) / n
            seen += n
        return BUCKETS_S[-1]

    @property
    def mean_s(self) -> float | None:
        """The mean, seconds, or ``None`` when nothing was counted."""
        total = self.count
        return self.sum_s / total if total else None


@dataclass
class Cell:
    """What one function x model did over one minute or a range of them.

    Attributes:
        function: the function label.
        model: the model label.
        statuses: status value -> calls.
        wait: the queue waits.
        run: the run times.
        fields: ``(field, reason)`` -> invalid-arguments calls it failed in.
    """

    function: str
    model: str
    statuses: dict[str, int] = field(default_factory=dict)
    wait: Histogram = field(default_factory=Histogram)
    run: Histogram = field(default_factory=Histogram)
    fields: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def calls(self) -> int:
        """Calls answered, every status."""
        return sum(self.statuses.values())

    @property
    def failed(self) -> int:
        """Calls answered with any status but ``ok``."""
        return self.calls - self.statuses.get("ok", 0)

    def rate(self, status: str) -> float:
        """The share of calls answered ``status``, 0 to 1 (0 when there were none)."""
        calls = self.calls
        return self.statuses.get(status, 0) / calls if calls else 0.0

    def add(self, other: Cell) -> None:
        """Add ``other``'s counts to these."""
        for status, n in other.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + n
        for key, n in other.fields.items():
            self.fields[key] = self.fields.get(key, 0) + n
        self.wait.add(other.wait)
        self.run.add(other.run)

    def top_fields(self, n: int = 5) -> list[tuple[str, str, int]]:
        """The ``n`` most frequent failing fields: ``(field, reason, calls)``, most first."""
        ranked = sorted(self.fields.items(), key=lambda item: (-item[1], item[0]))
        return [(name, reason, count) for (name, reason), count in ranked[:n]]


@dataclass
class Minute:
    """One minute's aggregates: ``start_s`` (epoch s) and ``(function, model)`` -> cell."""

    start_s: int
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)

    def by_function(self) -> dict[str, Cell]:
        """This minute's cells summed over models: function -> cell (its ``model`` is ``*``)."""
        summed: dict[str, Cell] = {}
        for (function, _model), cell in self.cells.items():
            summed.setdefault(function, Cell(function, "*")).add(cell)
        return summed


@dataclass
class Window:
    """The aggregates of a range of minutes, oldest first (minutes with no calls left out)."""

    minutes: list[Minute]

    def totals(self, *, model: str | None = None, function: str | None = None) -> list[Cell]:
        """The cells summed over the range, worst first.

        Worst: the highest share of calls not ``ok``, then the most failed calls, then
        by function and model name.

        Args:
            model: only this model label.
            function: only this function label.
        """
        summed: dict[tuple[str, str], Cell] = {}
        for minute in self.minutes:
            for (fn, md), cell in minute.cells.items():
                if (model is not None and md != model) or (function is not None and fn != function):
                    continue
                summed.setdefault((fn, md), Cell(fn, md)).add(cell)
        return sorted(
            summed.values(),
            key=lambda c: (
                -(c.failed / c.calls if c.calls else 0.0),
                -c.failed,
                c.function,
                c.model,
            ),
        )


class _Reader(Protocol):
    def pipeline(self, transaction: bool = ...) -> Any: ...  # noqa: D102


def read_window(
    client: _Reader, namespace: str | Sequence[str], since_s: float, until_s: float | None = None
) -> Window:
    """Read the minutes from ``since_s`` to ``until_s`` (epoch seconds, both included).

    One pipelined round trip holding one ``HGETALL`` per minute and prefix, at most
    :data:`MAX_WINDOW_MINUTES` (the newest ones of a longer range): bounded by the
    range, never by how many calls were made.

    Args:
        client: a redis-py client.
        namespace: the key prefix, or several (on a cluster each queue group's: a group's
            workers write its minutes in its slot); their counts add up.
        since_s: the range's start, epoch seconds.
        until_s: its end (default: now).

    Returns:
        The :class:`Window`; hash fields it does not understand are skipped.
    """
    prefixes = [namespace] if isinstance(namespace, str) else list(namespace)
    last = minute_of(time.time() if until_s is None else until_s)
    first = max(minute_of(since_s), last - (MAX_WINDOW_MINUTES - 1) * 60)
    starts = list(range(first, last + 1, 60))
    pipe = client.pipeline(transaction=False)
    for start in starts:
        for prefix in prefixes:
            pipe.hgetall(aggregates_key(prefix, start))
    replies = pipe.execute()
    minutes = []
    for i, start in enumerate(starts):
        raws = [raw for raw in replies[i * len(prefixes) : (i + 1) * len(prefixes)] if raw]
        if raws:
            minutes.append(_minute(start, raws))
    return Window(minutes)


def _minute(start_s: int, raws: Sequence[Mapping[Any, Any]]) -> Minute:
    minute = Minute(start_s)
    for key, value in (item for raw in raws for item in raw.items()):
        try:
            parts = codec.loads(key)
            count = int(value)
        except (codec.DecodeError, ValueError, TypeError):
            continue
        if not isinstance(parts, list) or len(parts) < 3:
            continue
        kind, function, model = parts[0], str(parts[1]), str(parts[2])
        cell = minute.cells.setdefault((function, model), Cell(function, model))
        _apply(cell, kind, parts[3:], count)
    return minute


def _apply(cell: Cell, kind: object, rest: list[Any], count: int) -> None:
    if kind == "c" and len(rest) == 1:
        cell.statuses[str(rest[0])] = cell.statuses.get(str(rest[0]), 0) + count
    elif kind in ("wl", "rl") and len(rest) == 1 and isinstance(rest[0], int):
        histogram = cell.wait if kind == "wl" else cell.run
        if 0 <= rest[0] < len(histogram.counts):
            histogram.counts[rest[0]] += count
    elif kind in ("ws", "rs") and not rest:
        histogram = cell.wait if kind == "ws" else cell.run
        histogram.sum_s += count / 1e6
    elif kind == "f" and len(rest) == 2:
        key = (str(rest[0]), str(rest[1]))
        cell.fields[key] = cell.fields.get(key, 0) + count
