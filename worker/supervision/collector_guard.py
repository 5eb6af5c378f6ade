"""A registry whose collectors cannot take ``/metrics`` down.

prometheus-client builds an exposition by calling ``collect()`` on each registered
collector and encoding every sample as UTF-8 at the end: one collector that raises
(Redis down, odd data) or one sample whose label value does not encode (a lone
surrogate) fails the whole scrape with a 500. :class:`GuardedRegistry` wraps each
collector registered with it: a collector that raises contributes the families it
yielded before the error, a sample that cannot be exposed is dropped, the rest of the
exposition is served, and each failure is counted in
``toolfleet_collector_errors_total{collector, kind}`` and logged once per collector,
kind and exception type.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

__all__ = [
    "COLLECTOR_RAISED",
    "MAX_LABEL_VALUE_CHARS",
    "SAMPLE_DROPPED",
    "CollectorErrors",
    "GuardedCollector",
    "GuardedRegistry",
    "exposable",
]

log = logging.getLogger("toolfleet.worker.metrics")

#: The longest label value an exposition serves, characters. toolfleet's own labels are
#: far shorter (function names at most 64, :mod:`toolfleet.shared.metric_labels`); a
#: longer one is dropped as unexposable.
MAX_LABEL_VALUE_CHARS = 256

#: ``kind`` of a collector whose ``collect()`` raised.
COLLECTOR_RAISED = "raised"
#: ``kind`` of a sample dropped: a label value not a string, not UTF-8-encodable or over
#: :data:`MAX_LABEL_VALUE_CHARS`, or a value that is not a number.
SAMPLE_DROPPED = "sample_dropped"


def exposable(labels: dict[str, Any], value: Any) -> bool:
    """True when a sample with ``labels`` and ``value`` can be written in an exposition.

    Every label value must be a string of at most :data:`MAX_LABEL_VALUE_CHARS`
    characters that encodes as UTF-8 (no lone surrogate); the value must convert to a
    float (NaN and infinities are valid exposition values).
    """
    for text in labels.values():
        if not isinstance(text, str) or len(text) > MAX_LABEL_VALUE_CHARS:
            return False
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return False
    try:
        float(value)  # what the exposition writes (an int past a float's range does not)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


class CollectorErrors:
    """Counts the failures of guarded collectors; itself the collector that exposes them.

    Exposes ``toolfleet_collector_errors_total{collector, kind}``: ``collector`` is the
    failing collector's class name, ``kind`` :data:`COLLECTOR_RAISED` (once per scrape
    it raised in) or :data:`SAMPLE_DROPPED` (once per sample dropped). Kept in this
    process's memory, never in a multiprocess file, so it is served even when reading
    those files is what fails. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, str], int] = {}
        self._logged: set[tuple[str, str, str]] = set()

    def record(self, collector: str, kind: str, why: str, count: int = 1) -> None:
        """Count ``count`` failures; log the first of each collector, kind and ``why``.

        Args:
            collector: the collector's class name.
            kind: :data:`COLLECTOR_RAISED` or :data:`SAMPLE_DROPPED`.
            why: what went wrong, for the log line (an exception's type, say); bounded
                by the code that fails, never wire text.
            count: how many failures.
        """
        with self._lock:
            key = (collector, kind)
            self._counts[key] = self._counts.get(key, 0) + count
            first = (collector, kind, why) not in self._logged
            self._logged.add((collector, kind, why))
        if first:
            log.warning(
                "metrics collector %s: %s (%s); the rest of /metrics is served, "
                "toolfleet_collector_errors_total counts each occurrence, this is logged once",
                collector,
                kind.replace("_", " "),
                why,
            )

    def collect(self) -> Iterator[Metric]:
        """``toolfleet_collector_errors_total``, one sample per collector and kind."""
        family = CounterMetricFamily(
            "toolfleet_collector_errors",
            "Metric collectors that raised, and samples dropped as unexposable, by collector.",
            labels=["collector", "kind"],
        )
        with self._lock:
            counts = sorted(self._counts.items())
        for (collector, kind), count in counts:
            family.add_metric([collector, kind], count)
        yield family


class GuardedCollector:
    """A collector whose failures are recorded instead of raised.

    Args:
        inner: the collector guarded.
        errors: where failures are recorded.
    """

    def __init__(self, inner: Collector, errors: CollectorErrors) -> None:
        self.inner = inner
        self.errors = errors
        self.name = type(inner).__name__

    def describe(self) -> Iterable[Metric]:
        """The inner collector's description, if it has one (registries check names with it)."""
        describe = getattr(self.inner, "describe", None)
        return describe() if describe is not None else []

    def collect(self) -> Iterator[Metric]:
        """The inner collector's families, less unexposable samples; never raises.

        The families yielded before an exception are kept; the exception is recorded.
        """
        families: list[Metric] = []
        try:
            for family in self.inner.collect():
                families.append(family)
        except Exception as exc:  # noqa: BLE001 - one collector never fails the scrape
            self.errors.record(self.name, COLLECTOR_RAISED, type(exc).__name__)
            log.debug("metrics collector %s raised", self.name, exc_info=True)
        for family in families:
            kept = [s for s in family.samples if exposable(s.labels, s.value)]
            if len(kept) != len(family.samples):
                dropped = len(family.samples) - len(kept)
                self.errors.record(self.name, SAMPLE_DROPPED, family.name, dropped)
                family.samples = kept
            yield family


class GuardedRegistry(CollectorRegistry):
    """A ``CollectorRegistry`` that guards every collector registered with it.

    Its :class:`CollectorErrors` (attribute ``errors``) is collected last, so
    ``toolfleet_collector_errors_total`` is always in its exposition and already counts
    the failures of the scrape that shows it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.errors = CollectorErrors()
        self._guards: dict[Collector, GuardedCollector] = {}

    def collect(self) -> Iterator[Metric]:
        """Every guarded collector's families, then ``toolfleet_collector_errors_total``."""
        yield from super().collect()
        yield from self.errors.collect()

    def register(self, collector: Collector) -> None:
        """Register ``collector`` behind a :class:`GuardedCollector`.

        Raises:
            ValueError: another collector already exposes one of its names.
        """
        guarded = GuardedCollector(collector, self.errors)
        super().register(guarded)
        self._guards[collector] = guarded

    def unregister(self, collector: Collector) -> None:
        """Remove ``collector`` (as registered with :meth:`register`).

        Raises:
            KeyError: it is not registered.
        """
        super().unregister(self._guards.pop(collector))
