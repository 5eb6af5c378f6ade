"""What a worker tells the outside about each call: metrics, signals, events, a log line."""

from __future__ import annotations

import logging
import time
from typing import Any

from toolfleet.shared import codec
from toolfleet.shared.aggregates import Accumulator
from toolfleet.shared.failures import FailureLog, record
from toolfleet.shared.metric_labels import field_label, function_label, model_label
from toolfleet.shared.signals import REDACTED, tool_requested, tool_responded
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult
from toolfleet.worker.pipeline.completer import Posted
from toolfleet.worker.registry.registry import Registry
from toolfleet.worker.registry.served_tool import ServedTool
from toolfleet.worker.supervision import metrics

__all__ = ["Observer"]

log = logging.getLogger("toolfleet.worker.calls")

#: Longest arguments/result text an event carries when an extension opts in, characters.
MAX_EVENT_PAYLOAD = 4096
#: Longest raw arguments text the log line of an ``invalid_arguments`` call carries.
MAX_LOGGED_ARGUMENTS = 2000


class Observer:
    """Counts, signals and describes calls for one worker process.

    Args:
        registry: what this process serves (extension of a function, redaction).
        worker_id: ``host:pid`` of this process, in every event.
        models: the model names counted by name (``quality_models``); others are ``other``.
        aggregates: counts each answered call for the per-minute aggregates the heartbeat
            writes (:mod:`toolfleet.shared.aggregates`); ``None``: they are off.
        failures: keeps each failed call for the failures index the heartbeat writes
            (:mod:`toolfleet.shared.failures`); ``None``: it is off.
        tally: keeps the per-call counts in memory until its next flush (a worker process
            flushes once per group commit and heartbeat); ``None``: each call writes them.

    A call is counted (:meth:`answered`) once its answer was written: a late result the
    fleet discards (the watchdog answered ``timeout`` first, and counted that) is not
    counted again.
    """

    def __init__(
        self,
        registry: Registry,
        worker_id: str,
        *,
        models: frozenset[str] = frozenset(),
        aggregates: Accumulator | None = None,
        failures: FailureLog | None = None,
        tally: metrics.Tally | None = None,
    ) -> None:
        self.registry = registry
        self.failures = failures
        self.tally = tally
        self.worker_id = worker_id
        self.models = models
        self.aggregates = aggregates
        #: call id -> the function label its in-flight gauge went up under (so it comes
        #: down under the same one, even if the served functions changed meanwhile)
        self._in_flight: dict[str, str] = {}
        #: function -> (the tool served under it, its label, slug and event-payload opt-in)
        self._facts: dict[str, tuple[ServedTool, tuple[str, str, bool]]] = {}

    def _label(self, function: str) -> str:
        """A call's ``function`` label: its name when served here, else ``unknown``.

        The rule: :func:`toolfleet.shared.metric_labels.function_label`.
        """
        return function_label(function, self.registry.served)

    def _facts_of(self, function: str) -> tuple[str, str, bool]:
        """A call's ``function`` label, extension slug and event-payload opt-in.

        ``""`` and ``False`` for a function not served. Kept per served tool: worked out
        again when another tool serves the name.
        """
        served = self.registry.served.get(function)
        if served is None:
            return self._label(function), "", False
        cached = self._facts.get(function)
        if cached is not None and cached[0] is served:
            return cached[1]
        facts = (self._label(function), served.extension.slug, served.extension.event_payloads)
        self._facts[function] = (served, facts)
        return facts

    def _base(self, request: ToolCallRequest, slug: str) -> dict[str, Any]:
        return {
            "id": request.id,
            "function": request.function,
            "extension": slug,
            "account": request.context.account,
            "worker": self.worker_id,
            "traceparent": request.context.traceparent,
        }

    def _payload(self, opted_in: bool, value: Any) -> Any:
        if not opted_in:
            return REDACTED
        text = self.registry.redactor.scrub(codec.dumps_str(value))
        return text[:MAX_EVENT_PAYLOAD]

    def _raw_arguments(self, request: ToolCallRequest) -> str:
        """The arguments as the model sent them, secrets scrubbed, at most 2,000 characters."""
        raw = request.arguments
        try:
            text = raw if isinstance(raw, str) else codec.dumps_str(raw)
        except codec.EncodeError:
            text = repr(raw)
        text = self.registry.redactor.scrub(text)
        return text if len(text) <= MAX_LOGGED_ARGUMENTS else text[:MAX_LOGGED_ARGUMENTS] + "…"

    def _count_fields(
        self, function: str, label: str, model: str, problems: tuple[tuple[str, str], ...]
    ) -> None:
        served = self.registry.served.get(function)
        declared = served.arguments_model.model_fields if served is not None else {}
        for path, reason in problems:
            metrics.INVALID_FIELDS.labels(label, model, field_label(path, declared), reason).inc()

    def requested(self, request: ToolCallRequest) -> dict[str, Any]:
        """A call was accepted: count it in flight and fire ``tool_requested``."""
        label, slug, opted_in = self._facts_of(request.function)
        self._in_flight[request.id] = label
        if self.tally is not None:  # written with the next flush (group commit, or each second)
            self.tally.inc(metrics.IN_FLIGHT, (label,))
        else:
            metrics.child(metrics.IN_FLIGHT, label).inc()
        event = {
            "kind": "tool_requested",
            "at": time.time(),
            **self._base(request, slug),
            "arguments": self._payload(opted_in, request.arguments),
        }
        if tool_requested.receivers:  # nobody listening: nothing to call
            tool_requested.send(request.function, **event)
        return event

    def answered(
        self, request: ToolCallRequest, result: ToolCallResult, queue: str, posted: int
    ) -> None:
        """Count a call whose answer was written, unless it came late and was discarded.

        ``posted`` is what writing it returned (a :class:`Posted` value).

        ``toolfleet_tool_calls_total``, the duration and wait histograms, the
        invalid-arguments counters, the per-minute aggregates and, for any status but
        ``ok``, the failures index: in memory, O(1).
        """
        if posted == Posted.ALREADY_ANSWERED:  # the first answer was counted
            return
        label, slug, _ = self._facts_of(request.function)
        model = model_label(request.context.llmclient, self.models)
        tally = self.tally
        if tally is not None:
            tally.inc(metrics.CALLS, (label, slug, result.status.value, model))
            if result.run_s is not None:
                tally.observe(metrics.CALL_DURATION, (label, model), result.run_s)
            if result.queued_s is not None:
                tally.observe(metrics.QUEUE_WAIT, (queue,), result.queued_s)
        else:
            metrics.child(metrics.CALLS, label, slug, result.status.value, model).inc()
            if result.run_s is not None:
                metrics.child(metrics.CALL_DURATION, label, model).observe(result.run_s)
            if result.queued_s is not None:
                metrics.child(metrics.QUEUE_WAIT, queue).observe(result.queued_s)
        if self.aggregates is not None:
            self.aggregates.record(
                label,
                model,
                result.status.value,
                queued_s=result.queued_s,
                run_s=result.run_s,
                problems=result.problems,
            )
        if result.status is Status.INVALID_ARGUMENTS:
            metrics.INVALID_ARGUMENTS.labels(label, model).inc()
            self._count_fields(request.function, label, model, result.problems)
        if self.failures is not None and not result.ok:
            self.failures.add(
                record(
                    request.id,
                    request.function,
                    result.status.value,
                    result.error,
                    account=request.context.account,
                    worker=self.worker_id,
                )  # fmt: skip
            )

    def responded(
        self, request: ToolCallRequest, result: ToolCallResult, queue: str, accepted: bool
    ) -> dict[str, Any]:
        """A reply is going out: in-flight gauge, ``tool_responded``, the per-call log line.

        The call is counted once its reply is written (:meth:`answered`).
        """
        label, slug, opted_in = self._facts_of(request.function)
        if accepted:
            went_up = self._in_flight.pop(request.id, label)
            if self.tally is not None:
                self.tally.inc(metrics.IN_FLIGHT, (went_up,), -1.0)
            else:
                metrics.child(metrics.IN_FLIGHT, went_up).dec()
        if result.status is Status.INVALID_ARGUMENTS:
            sent = self._raw_arguments(request)
            log.info("invalid arguments for %s (call %s): %s; the model sent: %s",
                     request.function, request.id, result.error, sent)  # fmt: skip
        event = {
            "kind": "tool_responded",
            "at": time.time(),
            **self._base(request, slug),
            "status": result.status.value,
            "queued_s": result.queued_s,
            "run_s": result.run_s,
            "result": self._payload(opted_in, result.content) if result.ok else None,
            "error": None if result.ok else result.error,
        }
        if tool_responded.receivers:
            tool_responded.send(request.function, **event)
        level = logging.DEBUG if result.ok else logging.INFO
        if log.isEnabledFor(level):
            log.log(
                level,
                "%s %s: %s",
                request.function,
                request.id,
                result.status.value,
                extra={
                    "status": result.status.value,
                    "queued_s": result.queued_s,
                    "run_s": result.run_s,
                },
            )
        return event
