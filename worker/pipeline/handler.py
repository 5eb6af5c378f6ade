"""Admit, run and complete one call on the slot thread that took its message.

The stages after :mod:`.fetch`: decode the request, drop a duplicate delivery, admit it
(:meth:`~.calls.CallPipeline.admit`), claim it, run it, and post its one reply through
the ledger's group commit, acknowledging its Dramatiq message in the same script.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis
from pydantic import ValidationError

from toolfleet.shared import codec, tracing
from toolfleet.shared.connect import is_cluster
from toolfleet.shared.metric_labels import function_label
from toolfleet.shared.text import as_text
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult, validation_problems
from toolfleet.worker.isolation.inproc import Abandoned
from toolfleet.worker.pipeline.calls import DEADLINE_GRACE_S, ISOLATION_MARGIN_S, CallPipeline
from toolfleet.worker.pipeline.fetch import FetchedClaim
from toolfleet.worker.pipeline.ledger import InlineAck, Ledger, Posted
from toolfleet.worker.pipeline.observe import Observer
from toolfleet.worker.pipeline.replies import post_rejection
from toolfleet.worker.pipeline.routes import RouteRecorder
from toolfleet.worker.pipeline.surrogates import has_lone_surrogate, replace_lone_surrogates
from toolfleet.worker.registry.served_tool import ServedTool
from toolfleet.worker.supervision import metrics
from toolfleet.worker.supervision.logs import call_scope

__all__ = ["STOPPED", "CallHandler", "RejectedMessage", "stream_event"]

log = logging.getLogger("toolfleet.worker.handler")


#: What the model reads of a call still running when its process's drain ran out of time.
STOPPED = (
    "the worker stopped (its shutdown grace period ran out) while running this call; "
    "not retried because the tool may have side effects"
)


class RejectedMessage(Exception):  # noqa: N818 - a verdict on a message, not an error of ours
    """The message was not a request.

    It is answered ``rejected`` where a reply address can be read, and dead-lettered.
    """


class CallHandler:
    """Answers messages, on the slot thread that took each.

    It decodes the message, drops a duplicate delivery of a call running in this
    process, and takes the call through the pipeline's decisions (:meth:`CallPipeline.admit`
    before the claim, :meth:`CallPipeline.after_claim` with it, then the run), posting
    the one reply through the ledger.

    Args:
        pipeline: decides each status and runs the calls.
        ledger: claims, outcomes and replies.
        observer: metrics, signals and events of each call.
        routes: records conversation routes before their reply (session affinity;
            ``None``: this process serves no tool with affinity).
    """

    #: Times one process hands one call back to its queue, at most.
    MAX_HAND_BACKS = 8

    def __init__(
        self,
        pipeline: CallPipeline,
        ledger: Ledger,
        observer: Observer,
        routes: RouteRecorder | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.ledger = ledger
        self.observer = observer
        self.routes = routes
        self._active: set[str] = set()
        self._active_lock = threading.Lock()
        self._handed_back: dict[str, int] = {}
        #: (claims of non-idempotent tools too, function -> fetch.lua's limits of it)
        self._claimable: tuple[bool, dict[str, tuple[float, float, int]]] | None = None
        #: claimed calls whose tool runs now: id -> (request, queue, requested event, ack)
        self._started: dict[
            str, tuple[ToolCallRequest, str, dict[str, Any] | None, InlineAck | None]
        ] = {}
        #: Puts a message back on its queue, for the n-th time (set by the loop).
        self.hand_back: Callable[[InlineAck, int], None] | None = None

    def handle(
        self,
        raw: Any,
        queue: str,
        ack: InlineAck | None = None,
        fetched: FetchedClaim | None = None,
    ) -> None:
        """Answer one message body (the orjson-encoded :class:`ToolCallRequest`).

        ``ack``, when given, is the message's Dramatiq acknowledgement, made in the same
        script that answers the call (``ack.done`` then; the loop acknowledges otherwise).
        ``fetched``, when given, is what the fetch script did for the call's claim.

        A request whose ``reply_to`` or ``id`` holds a lone surrogate (no Redis key can be
        named with it) is refused unrun, in one log line: with no reply when it is the
        ``reply_to``, else answered ``rejected`` on its reply list (the id in that reply
        has U+FFFD for each lone surrogate: :func:`~.replies.post_rejection`).

        Raises:
            RejectedMessage: the body is not a request (after answering ``rejected`` when a
                reply address can be read), so that the loop dead-letters it.
        """
        try:
            request = ToolCallRequest.decode(
                raw if isinstance(raw, (str, bytes)) else codec.dumps(raw)
            )
        except (codec.DecodeError, ValidationError, codec.EncodeError) as exc:
            why = validation_problems(exc) if isinstance(exc, ValidationError) else str(exc)
            self._reject_undecodable(raw, why)
            raise RejectedMessage(why[:500]) from None
        if has_lone_surrogate(request.reply_to):  # no reply list can be named with it
            log.warning(
                "refused call %r to %r: its reply_to holds a lone surrogate, so no reply can "
                "be posted", request.id, request.function,
            )  # fmt: skip
            return
        if has_lone_surrogate(request.id):  # it names no claim or outcome: refused unrun
            posted = post_rejection(
                self.ledger.client, self.ledger.reply_ttl_s, _reply_fields(request),
                "its id holds a lone surrogate", self.pipeline.worker_id,
            )  # fmt: skip
            log.warning(
                "refused call %r to %r: its id holds a lone surrogate; %s",
                request.id, request.function,
                "answered rejected" if posted else "the rejection could not be posted",
            )  # fmt: skip
            return
        if request.tool_call_id is not None and has_lone_surrogate(request.tool_call_id):
            # carried, not a key: made encodable as any text is, so the call runs as sent
            request = request.model_copy(
                update={"tool_call_id": replace_lone_surrogates(request.tool_call_id)}
            )
        with (
            tracing.consume(request, queue) as trace_ids,
            call_scope(
                call_id=request.id,
                function=request.function,
                traceparent=request.context.traceparent,
                **trace_ids,
            ),
        ):
            with self._active_lock:
                duplicate = request.id in self._active
                self._active.add(request.id)
            if duplicate:
                log.warning("call %s is running in this process; duplicate delivery dropped",
                            request.id)  # fmt: skip
                return
            claimed = fetched if fetched is not None and fetched.state != -1 else None
            try:
                unserved = self._handle(request, queue, _size_bound(raw), ack, claimed)
            finally:
                with self._active_lock:
                    self._active.discard(request.id)
            # handed back once this process no longer holds the call: a sibling thread
            # may fetch it at once, and would drop it as a duplicate delivery before
            if unserved is not None and not self._handed_back_now(request, ack, claimed):
                self._finish(request, unserved, queue, self.observer.requested(request), ack)

    def _handle(
        self,
        request: ToolCallRequest,
        queue: str,
        bound: int,
        ack: InlineAck | None,
        fetched: FetchedClaim | None = None,
    ) -> ToolCallResult | None:
        """Answer the call, or return its ``unknown_function`` answer to hand it back first.

        A call to a name this process does not serve while the fleet lists it (another
        version of its extension serves it) is returned unanswered, for :meth:`handle` to
        hand back (:meth:`_handed_back_now`).
        """
        early = self.pipeline.admit(request, bound)
        if early is not None:
            elsewhere = early.status is Status.UNKNOWN_FUNCTION or (
                self.pipeline.registry.pinned_elsewhere(request)  # another version's schema
            )
            if elsewhere and self._may_hand_back(request, ack):
                return early
            accepted = early.status is not Status.REJECTED  # counted as requested before
            requested = self.observer.requested(request) if accepted else None
            self._finish(request, early, queue, requested, ack)
            return None
        served = self.pipeline.registry.served.get(request.function)
        gate = self.pipeline.gate
        if gate is None or served is None or served.concurrency is None:
            return self._claimed(request, queue, ack, served, fetched)
        # a call that waits for a fleet-wide slot is claimed only once it holds one: if
        # its process dies while it waits, it is served again, not answered crashed
        gate.hold(request, served)
        try:
            return self._claimed(request, queue, ack, served)
        finally:
            gate.let_go(request, served)  # unless its run took the slot over

    def _claimed(
        self,
        request: ToolCallRequest,
        queue: str,
        ack: InlineAck | None,
        served: ServedTool | None,
        fetched: FetchedClaim | None = None,
    ) -> ToolCallResult | None:
        """Claim the call (unless the fetch did), then answer it (:meth:`_handle`'s rest)."""
        record = self.pipeline.in_flight(request)
        if fetched is not None:
            found = (fetched.state, fetched.value, fetched.cancel)
            claim = self.ledger.fetched_claim(request, queue, found, fetched.switches, record)
            token = as_text(fetched.value) if claim.acquired else self.ledger.new_token()
        else:
            token = self.ledger.new_token()
            durable = served is not None and not served.idempotent  # a second run would harm
            claim = self.ledger.claim(request, queue, token, record, durable=durable)
        if claim.under_replicated:  # run anyway: see docs/cluster.md, "Failover"
            label = function_label(request.function, self.pipeline.registry.served)
            metrics.CLAIMS_UNREPLICATED.labels(label).inc()
            log.warning(
                "call %s: its claim reached %s of %s replicas within the timeout; running it",
                request.id, claim.replicas_acked, claim.replicas_wanted,
            )  # fmt: skip
        if claim.switches is not None:  # read with the claim: a switch applies at once
            self.pipeline.registry.switches.load(claim.switches)
        if claim.outcome is not None:
            log.info("call %s was answered already; its reply went out with it", request.id)
            return None
        if not claim.acquired and claim.owner_alive:
            log.warning(
                "call %s is running on %s; duplicate delivery dropped", request.id, claim.owner
            )
            return None
        if not claim.acquired:  # its worker died: so did the concurrency lease it took
            self.pipeline.release_slot(request)
        decided = self.pipeline.after_claim(request, claim)
        if decided is not None:
            self._finish(request, decided, queue, ack=ack)
            return None
        if not claim.acquired:
            log.warning(
                "call %s: worker %s died; re-running the idempotent tool", request.id, claim.owner
            )
            self.ledger.take_over(request, token, record)
        requested = self.observer.requested(request)

        def answer(late: ToolCallResult) -> None:  # a fresh thread, past the limit
            self._finish(request, late, queue, requested, ack)

        with self._active_lock:
            self._started[request.id] = (request, queue, requested, ack)
        try:
            result = self.pipeline.call(request, answer)
        except Abandoned:
            raise  # answered by the thread that took this one's slot
        except BaseException:
            self.ledger.forget(request)
            crashed = self.pipeline.failure(request, Status.CRASHED, "worker error")
            self.observer.responded(request, crashed, queue, True)
            raise
        finally:
            with self._active_lock:
                self._started.pop(request.id, None)
        self._finish(request, result, queue, requested, ack)
        return None

    def answer_started(self) -> int:
        """Answer ``crashed`` every call this process claimed and has not answered yet.

        For the end of a drain whose grace ran out: the process exits, and a call it
        started gets its reply now instead of at its deadline (a late result of its tool
        is discarded). How many calls were answered.
        """
        with self._active_lock:
            started = list(self._started.values())
            self._started.clear()
        answered = 0
        for request, queue, requested, ack in started:
            crashed = self.pipeline.failure(request, Status.CRASHED, STOPPED)
            try:
                self._finish(request, crashed, queue, requested, ack)
                answered += 1
            except redis.RedisError as exc:
                log.warning("call %s left unanswered at exit: %s", request.id, exc)
        return answered

    def fetch_claims(self, expected: list[str]) -> tuple[list[str], list[Any], list[str]] | None:
        """``fetch.lua``'s claim keys and arguments: the fetch claims what it may.

        ``expected``: the ids the fetch expects to take (the claimed ones among them).

        It claims the calls of every served tool but one with a fleet-wide concurrency
        limit (claimed once it holds its slot) and, when a claim must reach replicas
        (``WAIT``, see :mod:`.ledger`), one that is not idempotent. None when no tool is
        claimable.
        """
        ledger = self.ledger
        durable_too = not is_cluster(ledger.client) and ledger.replicas_wanted("") == 0
        if self._claimable is None or self._claimable[0] != durable_too:
            claimable: dict[str, tuple[float, float, int]] = {}
            for name, served in self.pipeline.registry.served.items():
                if served.concurrency is not None or not (durable_too or served.idempotent):
                    continue
                isolation = (
                    "async"
                    if served.is_async and served.isolation == "thread"
                    else (served.isolation)
                )
                margin = ISOLATION_MARGIN_S.get(isolation, 0.0)
                claimable[name] = (served.timeout_s, margin, int(served.retry is not None))
            self._claimable = (durable_too, claimable)
        if not self._claimable[1]:
            return None
        return ledger.fetch_claim(self._claimable[1], DEADLINE_GRACE_S, expected)

    def drop_claim(self, call_id: str) -> None:
        """Give up the claim of a fetched call that will not be handled (logged on failure)."""
        try:
            self.ledger.release(call_id)
        except redis.RedisError as exc:
            log.warning("could not give up the claim of %s: %s", call_id, exc)

    def _may_hand_back(self, request: ToolCallRequest, ack: InlineAck | None) -> bool:
        """True to hand back a call to a name this process does not serve: it is listed.

        In a rolling upgrade, workers of two versions consume one queue and a name only
        one of them serves is still listed: a worker of the other version hands its
        message back (up to :attr:`MAX_HAND_BACKS` times a call) so that a worker serving
        it answers, instead of ``unknown_function``.
        """
        if ack is None or self.hand_back is None:
            return False
        if request.function not in self.pipeline.registry.listed:
            return False
        if len(self._handed_back) > 10_000:  # a bound on memory, not a policy
            self._handed_back.clear()
        times = self._handed_back.get(request.id, 0)
        if times >= self.MAX_HAND_BACKS:
            self._handed_back.pop(request.id, None)
            return False
        self._handed_back[request.id] = times + 1
        return True

    def _handed_back_now(
        self, request: ToolCallRequest, ack: InlineAck | None, fetched: FetchedClaim | None = None
    ) -> bool:
        """Put the call back at the end of its queue; False when that failed.

        A claim the fetch took goes first; the loop does not acknowledge it (``ack.done``).
        """
        if ack is None or self.hand_back is None:
            return False
        try:
            if fetched is not None and fetched.state == 1:
                self.ledger.release(request.id)
            self.hand_back(ack, self._handed_back.get(request.id, 1))
        except redis.RedisError as exc:
            log.warning("call %s could not be handed back: %s", request.id, exc)
            return False
        ack.done = True
        log.debug("call %s to %s handed back: not served here", request.id, request.function)
        return True

    def _finish(
        self,
        request: ToolCallRequest,
        result: ToolCallResult,
        queue: str,
        requested: dict[str, Any] | None = None,
        ack: InlineAck | None = None,
    ) -> None:
        tracing.record_status(result.status)
        responded = self.observer.responded(request, result, queue, requested is not None)
        events = [stream_event(responded, requested)]
        if self.routes is not None and result.route:
            self.routes.record(request, result)  # before the reply: the next call finds it
        answered = self.observer.answered
        try:  # counted once written, in the same batch
            posted = self.ledger.finish(
                request, result, events, ack,
                on_posted=lambda posted: answered(request, result, queue, posted),
            )  # fmt: skip
        except codec.EncodeError as exc:
            log.error("result of %s could not be encoded: %s", request.id, exc)
            unencodable = self.pipeline.unencodable(request)
            posted = self.ledger.finish(
                request, unencodable, ack=ack,
                on_posted=lambda posted: answered(request, unencodable, queue, posted),
            )  # fmt: skip
        if posted == Posted.ALREADY_ANSWERED:
            log.warning(
                "late %s result of %s (call %s) discarded: the call was answered already",
                result.status.value, request.function, request.id,
            )  # fmt: skip
            return
        log.debug("answered %s %s: %s", request.function, request.id, result.status.value)

    def _reject_undecodable(self, raw: Any, why: str) -> None:
        log.warning("rejected an undecodable request: %s", why[:300])
        post_rejection(
            self.ledger.client, self.ledger.reply_ttl_s, raw, why, self.pipeline.worker_id
        )


def _reply_fields(request: ToolCallRequest) -> dict[str, Any]:
    """What :func:`post_rejection` reads of a decoded request."""
    return {
        "id": request.id,
        "tool_call_id": request.tool_call_id,
        "function": request.function,
        "reply_to": request.reply_to,
    }


def stream_event(responded: dict[str, Any], requested: dict[str, Any] | None) -> dict[str, Any]:
    """The one ``<ns>:events`` entry of a call: its ``tool_responded`` event.

    When the call was run, the entry also carries the request's ``requested_at`` (epoch
    seconds) and ``arguments`` (``[redacted]`` unless the extension opted in) from its
    ``tool_requested`` event, which fires in-process only.
    """
    if requested is None:
        return responded
    return {**responded, "requested_at": requested["at"], "arguments": requested["arguments"]}


def _size_bound(raw: Any) -> int:
    """An upper bound of the encoded message in bytes (UTF-8: at most 4 bytes a character)."""
    if isinstance(raw, bytes):
        return len(raw)
    if isinstance(raw, str):
        return 4 * len(raw)
    return 1 << 62  # not a string: measure the arguments themselves
