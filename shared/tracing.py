"""OpenTelemetry spans for tool calls, optional (``pip install 'toolfleet[otel]'``).

One home for both sides of the trace:

- the producer opens a PRODUCER span per call when it builds the message
  (:func:`produce`, operation ``create``) and injects the current context as W3C
  ``traceparent``/``tracestate`` into the request's context;
- the worker extracts it and opens a CONSUMER span around the call's handling
  (:func:`consume`, operation ``process``) whose ids the worker's log lines carry
  (``trace_id``, ``span_id``); :func:`record_status` adds the call's status.

Attributes follow OpenTelemetry's messaging semantic conventions: ``messaging.system``
(``dramatiq``: the protocol on Redis), ``messaging.destination.name`` (the queue),
``messaging.message.id`` (the call id), ``messaging.operation.type``; plus
``toolfleet.function`` and, on the consumer, ``toolfleet.status``.

Only the OpenTelemetry API is used: the host application (or ``opentelemetry-instrument``)
configures an SDK. Without one the API is a no-op (no span is recorded, attributes are not
even built), and without the package installed these functions do nothing; a
``traceparent`` set by hand in :class:`~toolfleet.shared.wire.CallContext` still travels.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

from toolfleet.shared.wire import Status, ToolCallRequest

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
except ImportError:  # toolfleet[otel] not installed: nothing to do
    _OTEL = False
else:
    _OTEL = True

#: ``opentelemetry.trace.get_tracer_provider()`` loads a provider named by this variable
#: on first use (read once here: looking the environment up per call costs more than
#: the rest of :func:`producing`).
_PROVIDER_FROM_ENV = "OTEL_PYTHON_TRACER_PROVIDER" in os.environ
_UNKNOWN = object()

__all__ = ["MESSAGING_SYSTEM", "consume", "log_ids", "produce", "producing", "record_status"]

#: ``messaging.system`` of toolfleet's spans.
MESSAGING_SYSTEM = "dramatiq"
#: Statuses that mark the consumer span as an error (the model cannot fix them).
_ERRORS = frozenset({Status.CRASHED, Status.TIMEOUT, Status.EXPIRED, Status.REJECTED})
_TRACER = "toolfleet"


def _attributes(request: ToolCallRequest, queue: str, operation: str) -> dict[str, str]:
    return {
        "messaging.system": MESSAGING_SYSTEM,
        "messaging.destination.name": queue,
        "messaging.message.id": request.id,
        "messaging.operation.type": operation,
        "messaging.operation.name": operation,
        "toolfleet.function": request.function,
    }


def producing() -> bool:
    """Whether :func:`produce` would record a span or change a request, here and now.

    False without the package, and with only the API (no SDK configured) while no span
    is current: the no-op tracer then starts an invalid span and injects nothing, so a
    caller may skip :func:`produce` altogether (the hot path pays a function call).
    """
    if not _OTEL:
        return False
    if otel_context.get_current():  # a span (or another value) is current: ask the API
        return True
    return _provider_set()


def _provider_set() -> bool:
    """Whether a tracer provider (an SDK) is configured, or will be on first use."""
    # the API's global, set once by ``set_tracer_provider``; an API without it is asked
    provider = getattr(trace, "_TRACER_PROVIDER", _UNKNOWN)
    if provider is _UNKNOWN:
        return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    return provider is not None or _PROVIDER_FROM_ENV


@contextmanager
def produce(queue: str, request: ToolCallRequest) -> Iterator[ToolCallRequest]:
    """A PRODUCER span ``create <queue>`` while the message is built.

    Args:
        queue: the queue the call is published to.
        request: the call.

    Yields:
        ``request``, with the span's context as ``context.traceparent`` and
        ``context.tracestate`` when there is one (else unchanged: a hand-set value stays).
    """
    if not _OTEL:
        yield request
        return
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(f"create {queue}", kind=trace.SpanKind.PRODUCER) as span:
        if span.is_recording():
            span.set_attributes(_attributes(request, queue, "create"))
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if "traceparent" in carrier:
            update = {
                "traceparent": carrier["traceparent"],
                "tracestate": carrier.get("tracestate"),
            }
            request = request.model_copy(
                update={"context": request.context.model_copy(update=update)}
            )
        yield request


def _recording() -> bool:
    """True when a tracer provider is set (without one, no span records anything)."""
    return _OTEL and not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def consume(request: ToolCallRequest, queue: str) -> AbstractContextManager[dict[str, str]]:
    """A CONSUMER span ``process <queue>``, child of the request's context, around a call.

    Args:
        request: the call taken from ``queue``.
        queue: the queue it came from.

    Returns:
        A context manager whose value is the log fields ``trace_id`` and ``span_id`` (32
        and 16 hex digits) of the span, or of the request's ``traceparent`` when no span
        is recorded; empty when neither. With no tracer provider set, no span is opened.
    """
    if not _recording():  # a span would record nothing: absent from the path
        return nullcontext(log_ids(request.context.traceparent))
    return _consume(request, queue)


@contextmanager
def _consume(request: ToolCallRequest, queue: str) -> Iterator[dict[str, str]]:
    carrier = {"traceparent": request.context.traceparent, "tracestate": request.context.tracestate}
    parent = propagate.extract({k: v for k, v in carrier.items() if v})
    tracer = trace.get_tracer(_TRACER)
    with tracer.start_as_current_span(
        f"process {queue}", context=parent, kind=trace.SpanKind.CONSUMER
    ) as span:
        ids = log_ids(request.context.traceparent)
        if span.is_recording():
            span.set_attributes(_attributes(request, queue, "process"))
            own = span.get_span_context()
            ids = {"trace_id": f"{own.trace_id:032x}", "span_id": f"{own.span_id:016x}"}
        yield ids


def record_status(status: Status) -> None:
    """Add ``toolfleet.status`` to the current span (the call's CONSUMER span).

    A status the model cannot fix (crashed, timeout, expired, rejected) marks it an error.
    """
    if not _recording():
        return  # no tracer provider set: no span records anything
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("toolfleet.status", status.value)
    if status in _ERRORS:
        span.set_status(trace.StatusCode.ERROR, status.value)


def log_ids(traceparent: str | None) -> dict[str, str]:
    """``trace_id`` and ``span_id`` of a W3C ``traceparent``, lower-case hex.

    Args:
        traceparent: ``00-<32 hex>-<16 hex>-<2 hex>``, or None.

    Returns:
        The two fields, or an empty dict for None or a malformed value.
    """
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return {}
    try:
        int(parts[1], 16), int(parts[2], 16)
    except ValueError:
        return {}
    return {"trace_id": parts[1].lower(), "span_id": parts[2].lower()}
