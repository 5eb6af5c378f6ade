"""The pending-call table: every call a client has in flight, by id, with one deadline heap.

Both clients keep their calls here; the table resolves their futures (a
``concurrent.futures.Future`` or an ``asyncio.Future``: both only need ``done``,
``cancelled``, ``set_result`` and ``add_done_callback``). A shell feeds it what its
reply connection popped (:meth:`PendingTable.deliver`) and asks it, when its timer
fires, which calls are due (:meth:`PendingTable.due`); once the fleet has been told
(:mod:`.fleet`), :meth:`PendingTable.expire` resolves them. Thread-safe (one lock);
it never blocks on I/O.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from toolfleet.producer._core.observe import count_late_reply, observe_call
from toolfleet.producer.hooks import fire_responded
from toolfleet.shared import codec
from toolfleet.shared.metric_labels import UNKNOWN_FUNCTION_LABEL
from toolfleet.shared.wire import ReplyEnvelope, Status, ToolCallRequest, ToolCallResult, ToolEvent

__all__ = ["EventSink", "Pending", "PendingTable", "ResultFuture", "settle"]

log = logging.getLogger("toolfleet.producer.listener")

#: Receives the status events of one call.
EventSink = Callable[[ToolEvent], None]

#: Seconds the table remembers a call it resolved with the worker's recorded outcome,
#: whose reply is then on its way (dropped when it comes, not counted late).
ANSWERED_MEMORY_S = 300.0

_INVALID_STATE = (concurrent.futures.InvalidStateError, asyncio.InvalidStateError)


class ResultFuture(Protocol):
    """What the table needs of a call's future (sync or asyncio)."""

    def done(self) -> bool: ...  # noqa: D102
    def cancelled(self) -> bool: ...  # noqa: D102
    def set_result(self, result: ToolCallResult, /) -> None: ...  # noqa: D102
    def add_done_callback(self, fn: Callable[[Any], object], /) -> None: ...  # noqa: D102


class Pending:
    """One call waiting for its reply: what a result needs, not the whole request."""

    __slots__ = (
        "account",
        "call_id",
        "function",
        "future",
        "label",
        "on_event",
        "sent_at",
        "timeout_s",
        "tool_call_id",
    )

    def __init__(
        self,
        request: ToolCallRequest,
        future: ResultFuture,
        on_event: EventSink | None,
        label: str = UNKNOWN_FUNCTION_LABEL,
    ) -> None:
        self.call_id = request.id
        self.account = request.context.account
        self.tool_call_id = request.tool_call_id
        self.function = request.function
        self.timeout_s = request.timeout_s
        self.sent_at = request.sent_at
        self.future = future
        self.on_event = on_event
        #: the call's ``function`` metric label (:mod:`toolfleet.shared.metric_labels`)
        self.label = label

    def failure(self, status: Status, message: str, **timings: Any) -> ToolCallResult:
        """A non-``ok`` result of this call made by the producer."""
        return ToolCallResult(
            id=self.call_id,
            tool_call_id=self.tool_call_id,
            function=self.function,
            status=status,
            content={"error": message},
            **timings,
        )


def settle(future: ResultFuture, result: ToolCallResult) -> bool:
    """Resolve ``future`` with ``result`` unless it is done already; True when it was set."""
    if future.done():
        return False
    try:
        future.set_result(result)
    except _INVALID_STATE:  # canceled by its caller meanwhile
        return False
    return True


class PendingTable:
    """The calls of one client in flight.

    Args:
        on_settled: called once per registered call when its future is done, however
            (the in-flight slot it held is given back).
        on_cancel: called with the id of a call whose future its caller canceled (the
            client cancels it in the fleet).
        on_earliest: called when a new call's deadline became the earliest (the shell's
            timer re-arms).

    Attributes:
        late_replies: replies for an id no longer pending (dropped and counted).
    """

    def __init__(
        self,
        on_settled: Callable[[], None],
        on_cancel: Callable[[str], None] | None = None,
        on_earliest: Callable[[], None] | None = None,
    ) -> None:
        self._on_settled = on_settled
        self._on_cancel = on_cancel
        self._on_earliest = on_earliest
        self._pending: dict[str, Pending] = {}
        self._deadlines: list[tuple[float, str]] = []
        self._expiring: set[str] = set()
        self._answered: dict[str, float] = {}
        self._lock = threading.Lock()
        #: the one bound method every call's future gets as its done callback
        self._on_done: Callable[[Any], None] = self._settled
        self.closed = False
        self.late_replies = 0

    # -- registering -------------------------------------------------------------------

    def add(
        self,
        request: ToolCallRequest,
        future: ResultFuture,
        on_event: EventSink | None = None,
        *,
        label: str = UNKNOWN_FUNCTION_LABEL,
    ) -> None:
        """Expect ``request``'s reply (or resolve it at its deadline).

        Args:
            request: the call.
            future: resolved with its result.
            on_event: receives its status events, or ``None``.
            label: its ``function`` metric label
                (:func:`~toolfleet.shared.metric_labels.function_label`).

        Raises:
            RuntimeError: the table is closed (the future is resolved ``rejected``).
        """
        future.add_done_callback(self._on_done)
        entry = Pending(request, future, on_event, label)
        with self._lock:
            closed = self.closed
            if not closed:
                self._pending[request.id] = entry
                heapq.heappush(self._deadlines, (request.deadline, request.id))
                earliest = self._deadlines[0][1] == request.id
        if closed:
            settle(future, entry.failure(Status.REJECTED, "the client is closed", queued_s=0.0))
            raise RuntimeError("the client is closed")
        if earliest and self._on_earliest is not None:
            self._on_earliest()

    def holds(self, call_id: str) -> bool:
        """True while ``call_id`` is pending."""
        return call_id in self._pending

    @property
    def in_flight(self) -> int:
        """Calls still waiting for a reply."""
        return len(self._pending)

    # -- resolving ---------------------------------------------------------------------

    def resolve(self, call_id: str, status: Status, message: str, **timings: Any) -> bool:
        """Resolve a pending call now with a ``status`` result; False when not pending."""
        entry = self._pop(call_id)
        if entry is None:
            return False
        self._finish(entry, entry.failure(status, message, **timings))
        return True

    def answer(self, call_id: str, result: ToolCallResult) -> bool:
        """Resolve a pending call now with ``result``; False when not pending."""
        entry = self._pop(call_id)
        if entry is None:
            return False
        self._finish(entry, result)
        return True

    def deliver(self, batch: Iterable[bytes | str]) -> None:
        """Hand what the reply list held to the calls: events to their sink, results resolve."""
        for data in batch:
            try:
                document = codec.loads(data)
                result = _plain_result(document)
                if result is not None:  # the common reply: the envelope is not built
                    self._result(result)
                    continue
                envelope = ReplyEnvelope.model_validate(document)
            except Exception as exc:  # noqa: BLE001 - a bad reply is logged, not fatal
                self._undecodable(data, exc)
                continue
            if envelope.type == "event":
                self._event(envelope.event)
            elif envelope.result is not None:
                self._result(envelope.result)

    def due(self, now: float) -> list[str]:
        """Ids of the calls whose deadline passed (each handed out once), for :meth:`expire`."""
        ids: list[str] = []
        with self._lock:
            while self._deadlines and self._deadlines[0][0] <= now:
                _, call_id = heapq.heappop(self._deadlines)
                if call_id in self._pending and call_id not in self._expiring:
                    self._expiring.add(call_id)
                    ids.append(call_id)
            self._forget_answered(now)
        return ids

    def next_deadline(self) -> float | None:
        """The earliest deadline of a call still pending (Unix epoch seconds), or ``None``."""
        with self._lock:
            while self._deadlines and self._deadlines[0][1] not in self._pending:
                heapq.heappop(self._deadlines)
            return self._deadlines[0][0] if self._deadlines else None

    def expire(
        self, call_ids: Sequence[str], outcomes: Sequence[bytes | None] | None, why: str = ""
    ) -> list[str]:
        """Resolve calls the fleet was told this client gave up on (their marker is written).

        A call whose worker had recorded its outcome gets that result (its reply is on
        the way: dropped when it comes, not counted late); the others resolve
        ``timeout`` (or ``canceled`` when ``why`` is ``"canceled"``).

        Args:
            call_ids: the calls, from :meth:`due` (or a cancel).
            outcomes: per call, the recorded outcome read with the marker; ``None`` when
                the marker could not be written in time.
            why: ``""`` (the deadline passed) or ``"canceled"``.

        Returns:
            The ids resolved ``timeout``/``canceled`` by this client.
        """
        recorded = list(outcomes) if outcomes is not None else [None] * len(call_ids)
        resolved: list[str] = []
        for call_id, outcome in zip(call_ids, recorded, strict=True):
            result = _recorded(outcome)
            with self._lock:
                self._expiring.discard(call_id)
                entry = self._pending.pop(call_id, None)
                if entry is not None and result is not None:
                    self._answered[call_id] = time.time() + ANSWERED_MEMORY_S
            if entry is None:
                continue
            if result is None:
                result = _given_up(entry, why)
                resolved.append(call_id)
            self._finish(entry, result)
        return resolved

    def close(self, message: str) -> None:
        """Refuse new calls; resolve every pending one ``timeout`` now, none is dropped."""
        with self._lock:
            self.closed = True
            entries, self._pending = list(self._pending.values()), {}
        for entry in entries:
            self._finish(entry, entry.failure(Status.TIMEOUT, message))

    def orphan(self, message: str) -> None:
        """In a forked child: resolve the calls copied from the parent ``timeout`` now.

        Takes no lock (one held by a parent thread at the fork stays held in the child).
        """
        entries, self._pending = list(self._pending.values()), {}
        for entry in entries:
            self._finish(entry, entry.failure(Status.TIMEOUT, message))

    # -- internals ---------------------------------------------------------------------

    def _pop(self, call_id: Any) -> Pending | None:
        with self._lock:
            return self._pending.pop(call_id, None) if isinstance(call_id, str) else None

    def _finish(self, entry: Pending, result: ToolCallResult) -> None:
        if entry.future.done():
            return
        # observed before the caller resumes: its first use imports the metrics module, and
        # a fork() right after the call must not copy that import half done (a dead lock)
        observe_call(entry.label, result.status, entry.sent_at)
        if settle(entry.future, result):
            fire_responded(result, entry.account)

    def _result(self, result: ToolCallResult) -> None:
        entry = self._pop(result.id)
        if entry is not None:
            self._finish(entry, result)
            return
        with self._lock:
            answered = self._answered.pop(result.id, None) is not None
            if not answered:
                self.late_replies += 1
        if not answered:
            count_late_reply()

    def _event(self, event: ToolEvent | None) -> None:
        entry = self._pending.get(event.id) if event is not None else None
        if event is None or entry is None or entry.on_event is None:
            return
        try:
            entry.on_event(event)
        except Exception:  # noqa: BLE001 - a sink's failure never stops the listener
            log.exception("event sink of call %s failed", event.id)

    def _undecodable(self, data: bytes | str, exc: Exception) -> None:
        """Resolve ``rejected`` a call whose reply cannot be decoded but names its id."""
        log.error("undecodable reply: %s", str(exc)[:300])
        try:
            call_id = codec.loads(data)["result"]["id"]
        except Exception:  # noqa: BLE001 - nothing to resolve
            return
        entry = self._pop(call_id)
        if entry is not None:
            message = f"the worker's reply could not be read: {str(exc)[:200]}"
            self._finish(entry, entry.failure(Status.REJECTED, message))

    def _settled(self, future: Any) -> None:
        try:
            self._on_settled()
        except Exception:  # noqa: BLE001 - a hook's failure never breaks resolution
            log.exception("on_settled failed")
        if not future.cancelled() or self._pop(future.call_id) is None:
            return
        if self._on_cancel is not None:
            try:
                self._on_cancel(future.call_id)
            except Exception:  # noqa: BLE001 - canceling is best effort
                log.warning("could not cancel call %s in the fleet", future.call_id, exc_info=True)

    def _forget_answered(self, now: float) -> None:
        if self._answered:
            self._answered = {k: t for k, t in self._answered.items() if t > now}


def _plain_result(document: Any) -> ToolCallResult | None:
    """The result of a decoded ``{"type": "result", "result": {...}}`` reply, or ``None``.

    The result is validated alone; any other document gives ``None`` (the caller
    validates it as a whole envelope).

    A result that does not validate raises what validating its envelope raises (the
    message names ``result.<field>``, as the envelope's validation does).
    """
    if type(document) is not dict or document.get("type") != "result":
        return None
    fields = document.get("result")
    if type(fields) is not dict or document.get("event") is not None:
        return None
    try:
        return ToolCallResult.model_validate(fields)
    except ValueError:
        ReplyEnvelope.model_validate(document)  # raises the envelope's own error
        raise


def _recorded(outcome: bytes | None) -> ToolCallResult | None:
    if outcome is None:
        return None
    try:
        return ReplyEnvelope.decode(outcome).result
    except Exception:  # noqa: BLE001 - an unreadable outcome: the caller gets timeout
        return None


def _given_up(entry: Pending, why: str) -> ToolCallResult:
    if why == "canceled":
        return entry.failure(Status.CANCELED, "the call was canceled")
    return entry.failure(Status.TIMEOUT, f"no reply within {entry.timeout_s:.3g} s")
