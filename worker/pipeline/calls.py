"""The call pipeline: which status a call gets, and how one call is answered.

Every status a worker answers is decided here, from the cheapest check to the run:
:meth:`CallPipeline.admit` before the claim round trip to Redis (``rejected``,
``expired``, ``unknown_function``, ``not_available`` for reasons that need no fresh
state), :meth:`CallPipeline.after_claim` with what the claim read (``canceled``,
``expired``, ``crashed`` for a call whose worker died), and :meth:`CallPipeline.call`
for the rest (switches as read with the claim, ``invalid_arguments``, then the run:
``ok``, ``tool_error``, ``crashed``, ``timeout``, ``canceled``; a call stopped by a cancel
after its deadline passed is ``timeout``: the producer resolved it at the deadline).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from toolfleet.shared import codec
from toolfleet.shared.affinity import session_lost_reason
from toolfleet.shared.catalog import CatalogEntry, Refusal, governing_switches, refusal
from toolfleet.shared.catalog_life import contested_message, pin_refusal
from toolfleet.shared.errors import InvalidArgumentsError, ToolCallError
from toolfleet.shared.limits import deadline_problem
from toolfleet.shared.shaping import shape
from toolfleet.shared.tool import ExtensionContext
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult, ToolEvent
from toolfleet.worker.isolation.base import KILL_MARGIN_S, CallHandle, ChildToolError, Outcome
from toolfleet.worker.isolation.inproc import LOOP_MARGIN_S, InProcessRunner
from toolfleet.worker.pipeline.arguments import parse_arguments
from toolfleet.worker.pipeline.ledger import MIN_ANSWER_S, Claim, InFlight
from toolfleet.worker.pipeline.surrogates import replace_lone_surrogates
from toolfleet.worker.registry.registry import PLAIN_CONTEXT_FIELDS, Registry
from toolfleet.worker.registry.served_tool import ServedTool

if TYPE_CHECKING:
    from toolfleet.worker.isolation.process import ProcessRunner
    from toolfleet.worker.tenancy.gate import Gate

__all__ = [
    "CRASH_MESSAGE",
    "DEADLINE_GRACE_S",
    "EXPIRED_MESSAGE",
    "NOT_RETRIED",
    "UNENCODABLE_MESSAGE",
    "CallPipeline",
]

log = logging.getLogger("toolfleet.worker")

#: What the model reads when a tool fails unexpectedly (the traceback stays in the log).
CRASH_MESSAGE = "the tool failed unexpectedly; the error was logged (ref {ref})"
#: What the model reads when a call was picked up after its deadline.
EXPIRED_MESSAGE = "the call's deadline passed before it could run"
#: What the model reads when a non-idempotent call's worker died while running it.
NOT_RETRIED = (
    "the worker stopped while running this call; not retried because the tool may have side effects"
)
#: What the model reads when a finished call's reply does not encode.
UNENCODABLE_MESSAGE = "the tool's result could not be encoded"
#: Seconds past the caller's deadline a call bound by it may run: the producer resolves it
#: at the deadline and marks it resolved, so the worker's own ``timeout`` is not posted.
DEADLINE_GRACE_S = 0.5

#: Seconds past its limit a call may take to be answered by its own process, by isolation.
ISOLATION_MARGIN_S = {"thread": 0.0, "async": LOOP_MARGIN_S, "process": KILL_MARGIN_S}

#: Seconds between two progress events of one call (more are dropped).
PROGRESS_INTERVAL_S = 0.2

#: Posts a status event of a call to its reply list.
Emit = Callable[[ToolCallRequest, ToolEvent], None]


class CallPipeline:
    """Answers the calls of one worker process; :meth:`call` returns one result, never raises.

    A call runs under ``min(tool timeout_s, deadline - now)`` in the tool's isolation,
    with retries only for idempotent tools that declare them. Secret setting values are
    scrubbed from every reply; a result over ``max_result_bytes`` becomes a
    ``tool_error``, or, for a tool with ``result_shaping = "truncate"``, is cut to fit
    and answered ``ok`` with ``shaped`` set. A call's own ``max_result_bytes`` lowers the
    limit for its result.

    Args:
        registry: what this process serves.
        worker_id: ``host:pid`` written into every result.
        runner: runs ``thread``-isolation tools (a new one when omitted).
        process_runner: runs ``process``-isolation tools (``None``: they run in-process).
        emit: posts a status event of a call to its reply list; used only for requests
            with ``events`` on (``None``: no events).
        affinity_routes: queue -> the queue only this process's slot consumes, for the
            queues of tools with session affinity; results of a conversation's calls to
            those tools name it as their ``route``.
        max_result_bytes: largest encoded result posted, bytes.
        max_arguments_bytes: larger encoded arguments are answered ``rejected``, bytes.
        gate: fleet-wide concurrency limits and circuit breakers around each run
            (``None``: none).

    Attributes:
        running: request id -> :class:`CallHandle` of calls running now.
    """

    def __init__(
        self,
        registry: Registry,
        *,
        worker_id: str = "",
        runner: InProcessRunner | None = None,
        process_runner: ProcessRunner | None = None,
        emit: Emit | None = None,
        affinity_routes: Mapping[str, str] | None = None,
        max_result_bytes: int = 1_048_576,
        max_arguments_bytes: int = 1_048_576,
        gate: Gate | None = None,
    ) -> None:
        self.registry = registry
        self.worker_id = worker_id
        self.runner = runner or InProcessRunner()
        self.process_runner = process_runner
        self.emit = emit
        self.affinity_routes = dict(affinity_routes or {})
        self.max_result_bytes = max_result_bytes
        self.max_arguments_bytes = max_arguments_bytes
        self.gate = gate
        self.running: dict[str, CallHandle] = {}
        self._running_lock = threading.Lock()
        #: function -> (its catalog entry, the switches governing it)
        self._governing_switches: dict[str, tuple[CatalogEntry, Mapping[str, bool]]] = {}

    def close(self) -> None:
        """Stop the event loop and the tool child processes (at drain)."""
        self.runner.close()
        if self.process_runner is not None:
            self.process_runner.close()

    def cancel(self, call_id: str) -> bool:
        """Cancel a running call; False when it is not running here."""
        with self._running_lock:
            handle = self.running.get(call_id)
        return handle.cancel() if handle is not None else False

    # -- statuses decided without running the tool ------------------------------

    def failure(self, request: ToolCallRequest, status: Status, message: str) -> ToolCallResult:
        """A failure result of ``request`` from this worker (the message scrubbed)."""
        return self._failure(request, status, message, {"worker": self.worker_id})

    def unencodable(self, request: ToolCallRequest) -> ToolCallResult:
        """The ``crashed`` result posted instead of a result of ``request`` that does not encode."""
        return self.failure(request, Status.CRASHED, UNENCODABLE_MESSAGE)

    def admit(self, request: ToolCallRequest, size_bound: int) -> ToolCallResult | None:
        """The answer to ``request`` that needs no Redis, or ``None`` to claim and run it.

        ``rejected`` for a deadline or time budget out of bounds or arguments over
        ``max_arguments_bytes``; ``expired`` past the deadline; ``unknown_function``;
        ``not_available`` when the function is disabled or not available to the
        account. Switches are not judged here: their states come fresh with the claim,
        so a switch just turned on or off applies to the next call.

        Args:
            request: the decoded request.
            size_bound: an upper bound of the encoded message, bytes (the arguments are
                measured only when it exceeds the limit).
        """
        now = time.time()
        problem = deadline_problem(request.deadline, request.timeout_s, now)
        if problem:
            return self.failure(request, Status.REJECTED, problem)
        size = size_bound
        if size > self.max_arguments_bytes:
            size = request.arguments_size()
        if size > self.max_arguments_bytes:
            from toolfleet.worker.supervision import metrics  # the CLI loads this module

            metrics.OVERSIZE.labels("arguments").inc()
            message = (
                f"the arguments are {size} bytes, over the limit of {self.max_arguments_bytes}"
            )
            return self.failure(request, Status.REJECTED, message)
        return self._refusal(request, now, fresh_switches=False)

    def after_claim(self, request: ToolCallRequest, claim: Claim) -> ToolCallResult | None:
        """The answer the claim decides, or ``None`` to run the call.

        ``crashed`` for a call another worker took and died running, unless its tool is
        idempotent; ``canceled`` (``expired`` past the deadline) for a canceled call.
        """
        if not claim.acquired and not claim.owner_alive:
            served = self.registry.served.get(request.function)
            if served is None or not served.idempotent:
                return self.failure(request, Status.CRASHED, NOT_RETRIED)
        if claim.canceled:
            if request.deadline <= time.time():
                return self.failure(request, Status.EXPIRED, EXPIRED_MESSAGE)
            return self.failure(request, Status.CANCELED, "the call was canceled")
        return None

    def release_slot(self, request: ToolCallRequest) -> None:
        """Give back the concurrency slot a dead delivery of ``request`` may still hold.

        For a call whose claim names a worker that died: its lease (holder: the call id)
        would otherwise hold a slot until it ends, and a re-run of an idempotent tool
        would wait behind its own dead lease. One ``ZREM``, only for a limited tool.
        """
        served = self.registry.served.get(request.function)
        if self.gate is not None and served is not None and served.concurrency is not None:
            self.gate.limiter.release(request.function, request.id)

    def _refusal(
        self, request: ToolCallRequest, now: float, *, fresh_switches: bool
    ) -> ToolCallResult | None:
        timings = self._timings(request, now)
        if request.deadline <= now:
            return self._failure(request, Status.EXPIRED, EXPIRED_MESSAGE, timings)
        served = self.registry.served.get(request.function)
        entry = None if served is None else self.registry.catalog_entry(served)
        governing = None if entry is None else self._governing(entry)
        switches: Mapping[str, bool] = self.registry.switches.states
        if governing is not None and not fresh_switches:
            switches = dict.fromkeys(governing, True)
        known = None
        if served is None:  # an unknown function: the message names the nearest served ones
            known = {n: self.registry.catalog_entry(s) for n, s in self.registry.served.items()}
        refused = refusal(
            request.function, entry, switches, request.context.account,
            known=known, governing=governing,
        )  # fmt: skip
        if refused is None and served is not None:
            refused = self._pinned(request, served)
        if refused is not None:
            return self._failure(request, refused.status, refused.message, timings)
        return None

    def _governing(self, entry: CatalogEntry) -> Mapping[str, bool]:
        """``governing_switches(entry)``, worked out once per catalog entry (read only)."""
        cached = self._governing_switches.get(entry.name)
        if cached is not None and cached[0] is entry:
            return cached[1]
        governing = governing_switches(entry)
        self._governing_switches[entry.name] = (entry, governing)
        return governing

    def _pinned(self, request: ToolCallRequest, served: ServedTool) -> Refusal | None:
        """Why this worker's tool is not the one the call was listed for (``None``: it is).

        A name another tool holds fleet-wide is refused, and so is a call whose listed
        identity or schema hash is not this tool's (:func:`pin_refusal`): O(1) per call.
        """
        owner = self.registry.contested.get(request.function)
        if owner is not None:
            message = contested_message(request.function, owner, served.identity)
            return Refusal(Status.NOT_AVAILABLE, message)
        if request.identity is None and request.schema_hash is None:
            return None
        return pin_refusal(
            request.function,
            served.identity,
            served.schema_hash,
            asked_identity=request.identity,
            asked_hash=request.schema_hash,
        )

    def in_flight(self, request: ToolCallRequest) -> InFlight:
        """The watchdog's record of the call: by when this process answers it itself."""
        now = time.time()
        served = self.registry.served.get(request.function)
        limit_s = 0.0
        margin_s = 0.0
        if served is not None:
            limit_s = max(0.0, min(served.timeout_s, request.deadline - now + DEADLINE_GRACE_S))
            if served.retry is not None:  # retried: answered by the deadline at the latest
                limit_s = max(0.0, request.deadline - now + DEADLINE_GRACE_S)
            margin_s = ISOLATION_MARGIN_S.get(
                "async" if served.is_async and served.isolation == "thread" else served.isolation,
                0.0,
            )
        return InFlight(
            id=request.id,
            tool_call_id=request.tool_call_id,
            function=request.function,
            reply_to=request.reply_to,
            answer_by=now + max(limit_s, MIN_ANSWER_S) + margin_s,
            limit_s=limit_s,
        )

    def _timings(self, request: ToolCallRequest, now: float) -> dict[str, Any]:
        return {"queued_s": max(0.0, now - request.sent_at), "worker": self.worker_id}

    # -- the run ----------------------------------------------------------------

    def call(
        self,
        request: ToolCallRequest,
        answer: Callable[[ToolCallResult], None] | None = None,
    ) -> ToolCallResult:
        """Answer one request (never raises but :class:`~.inproc.Abandoned`).

        The local refusals of :meth:`admit` are checked again (time has passed since),
        now with the switch states the claim read.

        ``answer``, when given, posts the call's answer from another thread: a plain sync
        tool (no retries, limit, breaker, descriptions or affinity) then runs on this
        thread when it is a slot thread of the worker's loop, and at its limit (or a
        cancel) a fresh thread posts ``timeout`` (``canceled``) through ``answer`` while
        this one raises ``Abandoned`` once the tool returns.
        """
        started = time.time()
        refused = self._refusal(request, started, fresh_switches=True)
        if refused is not None:
            return refused
        timings = self._timings(request, started)
        served = self.registry.served[request.function]
        try:
            arguments = parse_arguments(request.arguments, served.arguments_model)
        except InvalidArgumentsError as exc:
            failed = self._failure(request, Status.INVALID_ARGUMENTS, str(exc), timings)
            return failed.model_copy(update={"problems": exc.problems})
        handle = CallHandle()
        with self._running_lock:
            self.running[request.id] = handle
        try:
            self._running_event(request, served, arguments)

            def run() -> ToolCallResult:
                return self._run_with_retries(request, served, arguments, handle, timings, answer)

            result = run() if self.gate is None else self.gate.guard(request, served, run, timings)
            stage = {Status.OK: "completed", Status.CANCELED: "canceled"}.get(result.status)
            if stage is not None and served.spec.describe is not None:
                description = self._describe(served, stage, arguments, result.content)
                result = result.model_copy(update={"description": description})
            route = self.affinity_routes.get(served.queue)
            if route and request.context.conversation and served.spec.affinity:
                result = result.model_copy(update={"route": route})
            return result
        finally:
            with self._running_lock:
                self.running.pop(request.id, None)

    def _running_event(
        self, request: ToolCallRequest, served: ServedTool, arguments: BaseModel
    ) -> None:
        if not request.events or self.emit is None:
            return
        running = self._describe(served, "running", arguments, None)
        canceled = self._describe(served, "canceled", arguments, None)
        self._event(request, "running", running, canceled_description=canceled)

    def _event(
        self,
        request: ToolCallRequest,
        kind: str,
        description: str | None,
        *,
        canceled_description: str | None = None,
    ) -> None:
        if not request.events or self.emit is None:
            return
        event = ToolEvent(
            id=request.id,
            kind=kind,  # type: ignore[arg-type]
            description=description,
            canceled_description=canceled_description,
        )
        try:
            self.emit(request, event)
        except Exception:  # noqa: BLE001 - an event is best effort; the result still goes out
            log.warning("could not post a %s event for %s", kind, request.id, exc_info=True)

    def _describe(
        self, served: ServedTool, stage: str, arguments: BaseModel, result: Any
    ) -> str | None:
        if served.spec.describe is None:
            return None
        try:
            text = served.spec.describe(stage, arguments, result)
        except Exception:  # noqa: BLE001 - a description never fails a call
            log.warning("%s: %s_description failed", served.function, stage, exc_info=True)
            return None
        return self.registry.redactor.scrub(text) if text else None

    def _progress_sink(self, request: ToolCallRequest) -> Callable[[str], None] | None:
        if not request.events or self.emit is None:
            return None
        last = [0.0]

        def progress(message: str) -> None:
            now = time.monotonic()
            if now - last[0] < PROGRESS_INTERVAL_S:
                return
            last[0] = now
            self._event(request, "progress", self.registry.redactor.scrub(str(message))[:1000])

        return progress

    def _run_with_retries(
        self,
        request: ToolCallRequest,
        served: ServedTool,
        arguments: BaseModel,
        handle: CallHandle,
        timings: dict[str, Any],
        answer: Callable[[ToolCallResult], None] | None = None,
    ) -> ToolCallResult:
        attempt = 1
        run_s = 0.0
        while True:
            limit_s = min(served.timeout_s, request.deadline - time.time() + DEADLINE_GRACE_S)
            fields = _plain_fields(request, self.worker_id, self.result_budget(request))
            context = self.registry.context(served, fields, self._progress_sink(request))
            handle.on_cancel(context.canceled_event.set)
            if answer is not None and self._inline(served):
                outcome = self._run_inline(
                    request, served, arguments, context, limit_s, handle, timings, answer
                )
            else:
                outcome = self._run(served, arguments, context, limit_s, handle)
            if outcome.timed_out:
                context.canceled_event.set()
            run_s += outcome.run_s
            timings["run_s"] = run_s
            result = self._result_of(request, served, outcome, limit_s, timings)
            retry = served.retry
            if retry is None or attempt >= retry.attempts or result.status.value not in retry.on:
                return result
            backoff = retry.backoff_s * 2 ** (attempt - 1)
            if time.time() + backoff >= request.deadline or handle.canceled_within(backoff):
                return result
            log.info("retrying %s (call %s), attempt %d", served.function, request.id, attempt + 1)
            attempt += 1

    def _inline(self, served: ServedTool) -> bool:
        """True when ``served`` runs on the calling slot thread (see :meth:`call`)."""
        spec = served.spec
        return (
            served.isolation == "thread"
            and not served.is_async
            and served.retry is None
            and served.breaker is None
            and served.concurrency is None
            and spec.describe is None
            and not spec.affinity
            and self.runner.can_run_inline()
        )

    def _run_inline(
        self,
        request: ToolCallRequest,
        served: ServedTool,
        arguments: BaseModel,
        context: ExtensionContext,
        limit_s: float,
        handle: CallHandle,
        timings: dict[str, Any],
        answer: Callable[[ToolCallResult], None],
    ) -> Outcome:
        """Run the tool on this thread; past its limit another thread answers (see call)."""

        def answer_outcome(outcome: Outcome) -> None:  # on the fresh thread
            context.canceled_event.set()
            with self._running_lock:
                self.running.pop(request.id, None)
            late = {**timings, "run_s": outcome.run_s}
            answer(self._result_of(request, served, outcome, limit_s, late))

        invoke = served.spec.invoke
        return self.runner.run_inline(
            lambda: invoke(arguments, context), limit_s, handle, answer_outcome
        )

    def _run(
        self,
        served: ServedTool,
        arguments: BaseModel,
        context: ExtensionContext,
        limit_s: float,
        handle: CallHandle,
    ) -> Outcome:
        if served.isolation == "process" and self.process_runner is not None:
            fields = {name: getattr(context, name) for name in PLAIN_CONTEXT_FIELDS}
            return self.process_runner.run(
                served.function,
                arguments.model_dump(mode="python", by_alias=True, exclude_unset=True),
                fields,
                self.registry.switches.snapshot(),
                limit_s,
                handle,
            )
        invoke = served.spec.invoke
        if served.is_async:
            return self.runner.run_async(lambda: invoke(arguments, context), limit_s, handle)
        return self.runner.run_sync(lambda: invoke(arguments, context), limit_s, handle)

    def result_budget(self, request: ToolCallRequest) -> int:
        """The most bytes ``request``'s result may take: its own budget or the worker's limit."""
        own = request.max_result_bytes
        return self.max_result_bytes if own is None else min(own, self.max_result_bytes)

    def _result_of(
        self,
        request: ToolCallRequest,
        served: ServedTool,
        outcome: Outcome,
        limit_s: float,
        timings: dict[str, Any],
    ) -> ToolCallResult:
        if outcome.canceled:
            if request.deadline <= time.time():  # the producer resolved it at its deadline
                message = "the call's deadline passed while it ran"
                return self._failure(request, Status.TIMEOUT, message, timings)
            return self._failure(request, Status.CANCELED, "the call was canceled", timings)
        if outcome.timed_out:
            message = f"the tool did not finish within {limit_s:.3g} s"
            return self._failure(request, Status.TIMEOUT, message, timings)
        error = outcome.error
        # a tool answers a status by raising its error class (ExtensionToolError: tool_error,
        # ToolTimeoutError from a tool enforcing its own limit: timeout); anything else crashed
        raised = error.status if isinstance(error, ToolCallError) else None
        if raised is not None and raised is not Status.OK:
            return self._failure(request, raised, str(error), timings)
        if error is not None:
            return self._crashed(request, error, timings)
        value = outcome.value
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        try:
            value = replace_lone_surrogates(self.registry.redactor.scrub_json(value))
            size = len(codec.dumps(value))
        except (codec.EncodeError, codec.DecodeError) as exc:
            return self._crashed(request, exc, timings)
        budget = self.result_budget(request)
        shaped = None
        if size > budget:
            from toolfleet.worker.supervision import (
                metrics,  # not at import: the CLI loads this module
            )

            cut = shape_to(value, budget) if served.result_shaping == "truncate" else None
            if cut is None:
                metrics.OVERSIZE.labels("result").inc()
                message = (
                    f"the result is {size} bytes, over the limit of {budget} bytes; "
                    "ask for less (narrow the query or paginate)"
                )
                return self._failure(request, Status.TOOL_ERROR, message, timings)
            metrics.SHAPED.labels(served.function).inc()
            value, shaped = cut, True
        return ToolCallResult(
            id=request.id,
            tool_call_id=request.tool_call_id,
            function=request.function,
            status=Status.OK,
            content=value,
            shaped=shaped,
            **timings,
        )

    def _failure(
        self, request: ToolCallRequest, status: Status, message: str, timings: dict[str, Any]
    ) -> ToolCallResult:
        return ToolCallResult.failure(
            request, status, self.registry.redactor.scrub(message), **timings
        )

    def _crashed(
        self, request: ToolCallRequest, error: BaseException, timings: dict[str, Any]
    ) -> ToolCallResult:
        if isinstance(error, ChildToolError):
            log.error("tool %s crashed in its process (call %s): %s", request.function,
                      request.id, error)  # fmt: skip
        else:
            log.error(
                "tool %s crashed (call %s)",
                request.function,
                request.id,
                exc_info=(type(error), error, error.__traceback__),
            )
        return ToolCallResult.failure(
            request, Status.CRASHED, CRASH_MESSAGE.format(ref=request.id), **timings
        )


def shape_to(value: Any, budget: int) -> Any:
    """``value`` cut to ``budget`` bytes (:func:`toolfleet.shared.shaping.shape`), or ``None``."""
    try:
        return shape(value, budget)[0]
    except ValueError:
        return None


def _plain_fields(
    request: ToolCallRequest, worker_id: str, max_result_bytes: int
) -> dict[str, Any]:
    """The plain context fields of ``request`` in process ``worker_id`` (plus slug, version).

    ``max_result_bytes``: the call's result budget (:meth:`CallPipeline.result_budget`).
    """
    ctx = request.context
    return {
        "call_id": request.id,
        "tool_call_id": request.tool_call_id,
        "function": request.function,
        "deadline": request.deadline,
        "account": ctx.account,
        "user": ctx.user,
        "llmclient": ctx.llmclient,
        "conversation": ctx.conversation,
        "traceparent": ctx.traceparent,
        "metadata": dict(ctx.metadata),
        "session_lost": session_lost_reason(request.session_holder, worker_id),
        "max_result_bytes": max_result_bytes,
    }
