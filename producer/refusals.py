"""Calls the producer answers itself, counted where the fleet counts every call.

A call refused before it reaches a worker (an unknown function, no live worker, over an
account quota, an open breaker, a bad call) never meets a worker's counters. The
producer counts it itself: in ``toolfleet_tool_calls_total`` of its own registry
(:mod:`toolfleet.producer.metrics`, at once, in memory), and, written to Redis in
batches, in the per-minute aggregates (:mod:`toolfleet.shared.aggregates`), the
failures index (:mod:`toolfleet.shared.failures`) and the events stream (one
``tool_responded`` event, ``worker`` ``producer``). So ``toolfleet quality``, the ops
page and ``toolfleet events`` see refusals as they see every other failure.

:meth:`RefusalLog.record` is O(1) and talks to no Redis. What it kept rides along with
the client's next publish (:meth:`RefusalLog.drain_into` queues it on the publish's own
pipeline: no extra round trip); a client that publishes nothing meanwhile writes it in
one pipeline of its own :data:`FLUSH_S` after the first refusal (the publisher's
periodic flush).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from toolfleet.shared import aggregates as agg
from toolfleet.shared import codec
from toolfleet.shared import failures as fl
from toolfleet.shared.metric_labels import UNKNOWN_FUNCTION_LABEL, AskedNames, model_label
from toolfleet.shared.naming import events_key
from toolfleet.shared.settings import Settings
from toolfleet.shared.wire import CallContext, Status, ToolCallResult

__all__ = ["FLUSH_S", "MAX_EVENTS", "Drained", "RefusalLog"]

#: Seconds a refusal waits for a publish to ride along before it is written on its own.
FLUSH_S = 1.0
#: Most refusal events kept while Redis is unreachable (the oldest are dropped).
MAX_EVENTS = 10_000
#: The events stream is capped at about this many entries (as the workers cap it).
EVENTS_MAXLEN = 100_000

#: The ``function`` label of a refused call: ``unknown`` for a name the catalog does not
#: hold (the workers' rule), else its name, bounded as the unknown-functions counter bounds
#: names (the first 100, then ``unknown``).
_LABELS = AskedNames()


@dataclass
class Drained:
    """What one write took from a :class:`RefusalLog` (put back if the write fails)."""

    counts: agg.Pending = field(default_factory=dict)
    failed: list[dict[str, Any]] = field(default_factory=list)
    events: list[bytes] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.counts or self.failed or self.events)


class RefusalLog:
    """The calls this client answered itself since its last write.

    Args:
        namespace: the key prefix the counts are written under.
        settings: ``aggregates_ttl_s``, ``failures_retention_s``, ``failures_max`` and
            ``quality_models`` (the model label's bound).
    """

    def __init__(self, namespace: str, settings: Settings) -> None:
        self.namespace = namespace
        self.settings = settings
        self._models = frozenset(settings.quality_models)
        self._lock = threading.Lock()
        self._counts = agg.Accumulator()
        self._failed = fl.FailureLog()
        self._events: list[bytes] = []
        self._pending = False
        #: called (outside the lock) when a refusal is kept while none was: the
        #: publisher's periodic flush arms its timer
        self.on_pending: Callable[[], None] | None = None

    def attach(self, publisher: Any, prefix: str | None = None) -> None:
        """Have ``publisher`` write what is kept, with each publish or on its own.

        ``publisher``: a :class:`~toolfleet.producer.publish.Publisher` or
        ``AsyncPublisher`` (its ``flush_later`` runs when no publish comes). ``prefix``:
        the key prefix to write under, if not the namespace (on a cluster, the default
        queue group's, one of those the ops page and ``toolfleet quality`` read).
        """
        if prefix is not None:
            self.namespace = prefix
        publisher.refusals = self
        self.on_pending = publisher.flush_later

    @property
    def pending(self) -> bool:
        """Whether refusals wait to be written."""
        return self._pending

    def record(self, result: ToolCallResult, context: CallContext) -> None:
        """Count one call answered by the producer (``result``: its answer). O(1), no I/O."""
        from toolfleet.producer import metrics  # lazily: no metric objects for a mere import

        unknown = result.status is Status.UNKNOWN_FUNCTION
        label = UNKNOWN_FUNCTION_LABEL if unknown else _LABELS.label(result.function)
        model = model_label(context.llmclient, self._models)
        status = result.status.value
        metrics.CALLS.labels(label, "", status, model).inc()
        now = time.time()
        if self.settings.aggregates_ttl_s > 0:
            self._counts.record(label, model, status, at_s=now)  # it never queued or ran
        if self.settings.failures_retention_s > 0:
            self._failed.add(
                fl.record(
                    result.id,
                    result.function,
                    status,
                    result.error,
                    account=context.account,
                    worker="producer",
                    at_s=now,
                )  # fmt: skip
            )
        event = {
            "kind": "tool_responded", "at": now, "id": result.id, "function": result.function,
            "extension": "", "account": context.account, "worker": "producer",
            "traceparent": context.traceparent, "status": status, "queued_s": result.queued_s,
            "run_s": None, "result": None, "error": result.error,
        }  # fmt: skip
        with self._lock:
            self._events.append(codec.dumps(event))
            if len(self._events) > MAX_EVENTS:
                del self._events[: len(self._events) - MAX_EVENTS]
            first = not self._pending
            self._pending = True
        if first and self.on_pending is not None:
            self.on_pending()

    def drain_into(self, pipe: Any) -> Drained:
        """Queue everything kept on ``pipe`` (a redis-py pipeline, sync or asyncio).

        Returns:
            What was taken: hand it to :meth:`restore` when the pipeline fails.
        """
        with self._lock:
            if not self._pending:
                return Drained()
            events, self._events = self._events, []
            self._pending = False
        drained = Drained(self._counts.drain(), self._failed.drain(), events)
        settings = self.settings
        if drained.counts:
            agg.write(pipe, self.namespace, drained.counts, settings.aggregates_ttl_s)
        fl.write(pipe, self.namespace, drained.failed, settings.failures_retention_s,
                 settings.failures_max)  # fmt: skip
        for event in events:
            pipe.xadd(events_key(self.namespace), {"event": event}, maxlen=EVENTS_MAXLEN,
                      approximate=True)  # fmt: skip
        return drained

    def restore(self, drained: Drained) -> None:
        """Keep what a failed write took, for the next one."""
        if not drained:
            return
        self._counts.restore(drained.counts)
        self._failed.restore(drained.failed)
        with self._lock:
            self._events[:0] = drained.events
            del self._events[: max(0, len(self._events) - MAX_EVENTS)]
            self._pending = True
