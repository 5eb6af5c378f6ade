"""``submit``, a turn and ``cancel`` as generators of I/O steps, the same for both clients.

Each operation is a generator: it yields a step (what I/O to do), and the shell sends
back the step's answer, or throws in the exception the I/O raised; the generator's
return value is the operation's. :func:`advance` is that exchange, once; a shell's
driver is a three-line loop around it (blocking or awaiting its :meth:`perform`).

The steps:

- :class:`ReadCatalog` -> a :class:`~toolfleet.producer.catalog.Catalog`.
- :class:`TakeSlot` -> whether an in-flight slot was taken (``wait_s`` ``None``: at once).
- :class:`Publish` -> per ``(queue, request)``, its outcome (``None``: enqueued) or the
  error Redis answered; with ``then``, ``None`` at once (write-behind: the shell hands
  the outcomes to ``then`` once the batch the calls went in is decided).
- :class:`MarkResolved` -> per call, its recorded outcome, or ``None`` when the marker
  could not be written in time (:mod:`.fleet`); never raises.
- :class:`FindQueued` -> per queue, the call's Dramatiq message (bytes) or ``None``.
- :class:`AnswerQueued` -> 1 when the call was answered ``canceled``, 0 when it had its
  outcome already.
- :class:`ForeignCancel` -> ``(finished, marked, receivers)``.
- :class:`ReadRoutes` -> per key, the conversation's route record (bytes) or ``None``.
- :class:`CheckLive` -> per queue, how many workers beat on it within the worker TTL.

The steps every call makes (:class:`ReadCatalog`, :class:`TakeSlot`, :class:`Publish`,
:class:`Done`) are plain slotted dataclasses: a frozen one's ``__init__`` sets each
field through ``object.__setattr__``, about twice the cost of the step itself. Nothing
changes a step once made.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from toolfleet.producer._core.calls import (
    REDIS_FAILURES,
    Refusal,
    admit,
    catalog_refusal,
    check_idempotency_key,
    check_timeout,
    local_result,
    make_context,
    prepare_turn_call,
    publish_refusal,
    turn_share,
)
from toolfleet.producer._core.config import ClientConfig, Identity
from toolfleet.producer._core.fleet import QueuedCancel, queued_cancel, queued_request
from toolfleet.producer._core.follow import Following
from toolfleet.producer._core.listing import tool_list
from toolfleet.producer._core.observe import count_refused, count_unknown
from toolfleet.producer._core.pending import PendingTable, ResultFuture, settle
from toolfleet.producer._redis import connection_failed
from toolfleet.producer.affinity import SlotWatch, route_key_of, routed, unchecked
from toolfleet.producer.backpressure import QueueLengths, backpressure_error
from toolfleet.producer.catalog import Catalog
from toolfleet.producer.events import CallEvent, preparing_event
from toolfleet.producer.hooks import fire_refused, fire_requested
from toolfleet.producer.publish import Outcome
from toolfleet.producer.refusals import RefusalLog
from toolfleet.producer.stream import TurnState
from toolfleet.producer.turns import TurnCall, parse_tool_calls
from toolfleet.shared.affinity import decode_route
from toolfleet.shared.errors import ClientClosedError, IdempotencyKeyError
from toolfleet.shared.extension_errors import current_errors
from toolfleet.shared.idempotency import Duplicate, Idempotency, fingerprint, misuse_message
from toolfleet.shared.metric_labels import function_label
from toolfleet.shared.naming import idempotency_key, idempotency_namespace, reply_namespace
from toolfleet.shared.tenancy.enqueue import Refused
from toolfleet.shared.wire import CallContext, Status, ToolCallRequest, ToolCallResult

__all__ = [
    "AnswerQueued",
    "CheckLive",
    "Done",
    "FindQueued",
    "ForeignCancel",
    "MarkResolved",
    "ProducerCore",
    "Publish",
    "ReadCatalog",
    "ReadRoutes",
    "Step",
    "TakeSlot",
    "advance",
]

log = logging.getLogger("toolfleet.producer")


@dataclass(slots=True)  # not frozen: made per call (see the module's note)
class ReadCatalog:
    """Read the catalog (cached); a miss of ``functions`` re-reads.

    ``deadline``: wait no later (epoch seconds; ``None``: the socket timeout).
    """

    functions: str | list[str] | None
    deadline: float | None = None


@dataclass(slots=True)  # not frozen: made per call (see the module's note)
class TakeSlot:
    """Take an in-flight slot, waiting up to ``wait_s`` seconds (``None``: not at all)."""

    wait_s: float | None


@dataclass(slots=True)  # not frozen: made per call (see the module's note)
class Publish:
    """Publish ``items`` (``(queue, request)``), waiting no later than ``deadline`` (epoch s).

    ``no_breaker``: the functions whose catalog entry declares no breaker (the enqueue
    script does not read their breaker state); ``keys``: the idempotency keys of the
    requests that carry one, by request id; ``then``: the shell does not wait, it appends
    the calls to the client's outgoing batch and calls ``then`` with their outcomes later
    (from its publisher); a call still unsent at ``deadline`` is not sent.
    """

    items: list[tuple[str, ToolCallRequest]]
    deadline: float
    no_breaker: frozenset[str] = frozenset()
    keys: dict[str, Idempotency] | None = None
    then: Callable[[list[Outcome]], None] | None = None


@dataclass(frozen=True, slots=True)
class ReadRoutes:
    """Read (``GETEX``, keeping them ``ttl_s`` seconds longer) the route records ``keys``."""

    keys: list[str]
    ttl_s: int


@dataclass(frozen=True, slots=True)
class CheckLive:
    """Count the live workers of each of ``queues`` (slot queues met for the first time)."""

    queues: list[str]


@dataclass(frozen=True, slots=True)
class MarkResolved:
    """Write the ``RESOLVED`` marker of ``call_ids`` and read their recorded outcomes."""

    call_ids: list[str]


@dataclass(frozen=True, slots=True)
class ReadExtensionErrors:
    """Read the extension errors the workers report (the raw hash)."""


@dataclass(frozen=True, slots=True)
class ForeignCancel:
    """Ask the fleet to cancel a call this client does not hold."""

    call_id: str


@dataclass(frozen=True, slots=True)
class FindQueued:
    """Read the Dramatiq message of ``call_id`` in each of ``queues`` (one pipeline)."""

    call_id: str
    queues: list[str]


@dataclass(frozen=True, slots=True)
class AnswerQueued:
    """Run :data:`~toolfleet.producer._core.fleet.CANCEL_QUEUED_SCRIPT` for one call."""

    cancel: QueuedCancel


Step = (
    ReadCatalog
    | TakeSlot
    | Publish
    | MarkResolved
    | FindQueued
    | AnswerQueued
    | ForeignCancel
    | ReadExtensionErrors
    | ReadRoutes
    | CheckLive
)


@dataclass(slots=True)  # not frozen: made per call (see the module's note)
class Done:
    """The operation's return value."""

    value: Any


def advance(steps: Generator[Step, Any, Any], answer: Any, error: BaseException | None) -> Any:
    """Hand ``answer`` (or ``error``) to ``steps``; its next :data:`Step`, or :class:`Done`."""
    try:
        return steps.throw(error) if error is not None else steps.send(answer)
    except StopIteration as stop:
        return Done(stop.value)


class ProducerCore:
    """The decisions of one client in one process (a new one after ``fork()``).

    Args:
        config: the client's configuration.
        on_settled: gives an in-flight slot back (once per published call).
        on_cancel: cancels in the fleet a call whose future its caller canceled.
        on_earliest: the earliest deadline moved (the shell's timer re-arms).
        on_follow: a duplicate began waiting in :attr:`following` (the shell's poller runs).

    Attributes:
        identity: this process's client id and reply list.
        table: the calls in flight.
        following: the duplicates (idempotency keys) waiting for their first call's outcome.
        slots: the session-affinity slot queues met in routes (their liveness is read
            with the catalog).
    """

    def __init__(
        self,
        config: ClientConfig,
        on_settled: Callable[[], None],
        on_cancel: Callable[[str], None] | None = None,
        on_earliest: Callable[[], None] | None = None,
        on_follow: Callable[[], None] | None = None,
    ) -> None:
        self.config = config
        self.identity = Identity.new(config.namespace)
        self.table = PendingTable(on_settled, on_cancel, on_earliest)
        self.following = Following(config.namespace)
        #: the key prefix of a queue's calls (its group's on a cluster; the shell sets it)
        self.prefix_of: Callable[[str], str] = lambda _queue: config.namespace
        self._on_follow = on_follow
        self.lengths = QueueLengths(config.settings.max_queue_length)
        self.slots = SlotWatch()
        #: the calls this client answered itself, for the fleet's counts (the shell's
        #: publisher writes them with its next publish, or on its own after a while)
        self.refusals = RefusalLog(config.namespace, config.settings)

    def slot_wait_s(self, deadline: float) -> float:
        """Seconds a call may wait for a slot: ``submit_timeout_s``, never past ``deadline``."""
        return min(self.config.submit_timeout_s, deadline - time.time())

    def register(
        self, request: ToolCallRequest, future: ResultFuture, sink: Any, label: str
    ) -> None:
        """Expect ``request``'s reply (its slot is given back when it resolves).

        Args:
            request: the call, admitted.
            future: resolved with its result.
            sink: receives its status events, or ``None``.
            label: its ``function`` metric label: :func:`function_label` of the catalog
                snapshot that admitted it.

        Raises:
            ClientClosedError: the client is closed (the future is answered ``rejected``).
        """
        fire_requested(request)
        try:
            self.table.add(request, future, sink, label=label)
        except RuntimeError:
            raise ClientClosedError("the client is closed") from None

    def idempotency(
        self, request: ToolCallRequest, key: Any, index: int | None = None, queue: str = ""
    ) -> Idempotency | None:
        """The idempotency key of ``request`` ready for the enqueue script (``None``: none).

        Args:
            request: the call.
            key: the caller's key, or ``None``.
            index: the call's position in a turn made under ``key``.
            queue: the queue the call is published on: its record is in the queue's
                group's slot (:attr:`prefix_of`), beside the call's other keys.

        Raises:
            ClientError: a key that is not a non-empty string of at most 256 characters.
        """
        if key is None:
            return None
        key = check_idempotency_key(key)
        prefix = self.prefix_of(queue) if queue else self.config.namespace
        record = idempotency_key(prefix, request.context.account, key, index)
        return Idempotency(key, record, fingerprint(request.function, request.arguments))

    def published(
        self,
        request: ToolCallRequest,
        outcome: Outcome,
        label: str,
        idempotency: Idempotency | None = None,
    ) -> None:
        """Settle a call by its publish outcome, unless it was published (or may have been).

        ``label`` is the call's ``function`` metric label (as given to :meth:`register`).
        A duplicate of an earlier call (same idempotency key, same call) waits for that
        call's outcome in :attr:`following`.

        Raises:
            IdempotencyKeyError: the call's idempotency key was used for a different call
                (after answering the call ``rejected``).
            Exception: ``outcome`` when it is not a Redis failure (after answering the
                call ``rejected``).
        """
        if outcome is None:
            return
        if isinstance(outcome, Duplicate):
            if outcome.misuse:
                message = misuse_message(idempotency.key if idempotency else "")
                self.table.resolve(request.id, Status.REJECTED, message, queued_s=0.0)
                raise IdempotencyKeyError(message)
            prefix = idempotency_namespace(idempotency.record) if idempotency else ""
            self.following.add(request, outcome.call_id, prefix or None)
            if self._on_follow is not None:
                self._on_follow()
            return
        if isinstance(outcome, Refused):  # over a quota or breaker open: nothing published
            count_refused(label, outcome.reason)
            answer = outcome.result(request)
            self.refusals.record(answer, request.context)
            self.table.answer(request.id, answer)
            return
        refusal = publish_refusal(outcome)
        if refusal is None:
            # the request may have reached Redis: its reply may still come; the deadline
            # resolves it otherwise (never report "not sent" for a call that may run)
            log.warning("publishing call %s may have failed: %s", request.id, outcome)
            return
        self.refusals.record(local_result(request, refusal.status, refusal.message),
                             request.context)  # fmt: skip
        self.table.resolve(request.id, refusal.status, refusal.message, queued_s=0.0)
        if not isinstance(outcome, REDIS_FAILURES):
            raise outcome

    def published_later(self, request: ToolCallRequest, outcome: Outcome, label: str) -> None:
        """:meth:`published` for a call whose caller did not wait (write-behind): never raises.

        A failure that :meth:`published` would raise (the call answered ``rejected``
        first) is logged instead: its caller has the future already.
        """
        try:
            self.published(request, outcome, label)
        except Exception:
            log.exception("publishing call %s failed", request.id)

    def _refused(self, result: ToolCallResult, context: CallContext) -> ToolCallResult:
        """A call answered before publishing: counted and signalled."""
        if result.status is Status.UNKNOWN_FUNCTION:
            models = self.config.settings.quality_models
            count_unknown(result.function, context.llmclient, models)
        self.refusals.record(result, context)
        return fire_refused(result, context)

    # -- operations ----------------------------------------------------------------------

    def submit(
        self, request: ToolCallRequest, future: ResultFuture, idempotency_key: Any = None
    ) -> Generator[Step, Any, None]:
        """Admit, publish and register one call (see ``ToolClient.submit``).

        Raises:
            BackpressureError: no in-flight slot within the wait.
            ClientClosedError: the client closed.
            ClientError: a bad ``idempotency_key``.
            IdempotencyKeyError: ``idempotency_key`` was used for a different call.
        """
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)  # before anything is read or published
        try:
            catalog = yield ReadCatalog(request.function, request.deadline)
        except REDIS_FAILURES as exc:
            refusal = catalog_refusal(exc, request.timeout_s)
            refused = local_result(request, refusal.status, refusal.message)
            settle(future, self._refused(refused, request.context))
            return
        admitted = admit(request, catalog, self.config.settings, self.lengths)
        if isinstance(admitted, Refusal):
            refused = local_result(request, admitted.status, admitted.message)
            settle(future, self._refused(refused, request.context))
            return
        idempotency = self.idempotency(request, idempotency_key, queue=admitted)
        ((admitted, request),) = yield from self._route([(admitted, request)], catalog)
        if not (yield TakeSlot(None)):
            wait_s = self.slot_wait_s(request.deadline)
            if not (yield TakeSlot(wait_s)):
                raise backpressure_error(self.config.max_in_flight, max(0.0, wait_s))
        label = function_label(request.function, catalog.typed)
        self.register(request, future, None, label)
        no_breaker = catalog.without_breaker([request.function])
        items = [(admitted, request)]
        if idempotency is None:  # write-behind: the future is the caller's at once

            def then(outcomes: list[Outcome]) -> None:
                self.published_later(request, outcomes[0], label)

            try:
                yield Publish(items, request.deadline, no_breaker, None, then)
            except Exception as exc:  # noqa: BLE001 - not handed over (not encodable)
                self.published(request, exc, label)
            return
        try:  # misuse of the key is raised here: wait for the outcome
            (outcome,) = yield Publish(
                items, request.deadline, no_breaker, {request.id: idempotency}
            )
        except Exception as exc:  # noqa: BLE001 - classified by published()
            outcome = exc
        self.published(request, outcome, label, idempotency)

    def turn(
        self,
        tool_calls: Any,
        context: CallContext | dict[str, Any] | None,
        timeout_s: float,
        emit: Callable[[CallEvent], None] | None,
        new_future: Callable[[str], ResultFuture],
        idempotency_key: Any = None,
        max_result_bytes: int | None = None,
    ) -> Generator[Step, Any, TurnState]:
        """Parse a turn, answer what the producer refuses, publish the rest in batches.

        With ``idempotency_key`` each call of the turn carries the key and its position
        (the same turn submitted again is answered call by call with the first outcomes).
        ``max_result_bytes`` (checked already) is the turn's budget for all its results,
        split between its calls (:func:`turn_share`).

        Returns:
            The turn's state (``state.deadline``: its deadline, epoch seconds).

        Raises:
            ClientError: not a turn, or a bad context, timeout or ``idempotency_key``.
            IdempotencyKeyError: ``idempotency_key`` was used for a different turn (after
                the turn's other calls were published and every call answered).
        """
        if idempotency_key is not None:
            check_idempotency_key(idempotency_key)  # before anything is published
        turn = parse_tool_calls(tool_calls)
        ctx = make_context(context)
        timeout_s = check_timeout(timeout_s)
        state = TurnState(turn, emit, deadline=time.time() + timeout_s)
        catalog: Catalog | Refusal = Refusal(Status.NOT_AVAILABLE, "")  # read when there are calls
        if turn.calls:
            try:
                functions = [c.function for c in turn.calls if c.function]
                catalog = yield ReadCatalog(functions, state.deadline)
            except REDIS_FAILURES as exc:
                catalog = catalog_refusal(exc, timeout_s)
        batch: list[tuple[int, str, ToolCallRequest]] = []
        share = turn_share(max_result_bytes, len(turn.calls))
        keys: dict[str, Idempotency] = {}
        admitted: list[tuple[TurnCall, tuple[str, ToolCallRequest]]] = []
        for call in turn.calls:
            prepared = prepare_turn_call(
                call,
                context=ctx,
                timeout_s=timeout_s,
                deadline=state.deadline,
                events=state.streaming,
                reply_to=self.identity.reply_to,
                catalog=catalog,
                settings=self.config.settings,
                lengths=self.lengths,
                max_result_bytes=share,
                context_checked=ctx is not context,
            )
            if isinstance(prepared, ToolCallResult):
                state.answer(call.index, self._refused(prepared, ctx))
                continue
            admitted.append((call, prepared))
        queues = {call.index: queue_name for call, (queue_name, _) in admitted}
        if isinstance(catalog, Catalog):
            places = yield from self._route([item for _, item in admitted], catalog)
            admitted = [(call, place) for (call, _), place in zip(admitted, places, strict=True)]
        for call, (queue_name, request) in admitted:
            queue = queues[call.index]
            idempotency = self.idempotency(request, idempotency_key, call.index, queue)
            if idempotency is not None:
                keys[request.id] = idempotency
            if not (yield TakeSlot(None)):
                yield from self._publish_batch(state, batch, new_future, catalog, keys)
                batch = []
                wait_s = self.slot_wait_s(state.deadline)
                if not (yield TakeSlot(wait_s)):
                    error = backpressure_error(self.config.max_in_flight, max(0.0, wait_s))
                    refused = local_result(request, Status.REJECTED, str(error))
                    state.answer(call.index, self._refused(refused, ctx))
                    continue
            batch.append((call.index, queue_name, request))
        yield from self._publish_batch(state, batch, new_future, catalog, keys)
        return state

    def tools(
        self,
        account: str | None,
        format: str,
        include_unavailable: bool,  # noqa: A002
        metadata: bool = False,
    ) -> Generator[Step, Any, list[dict[str, Any]]]:
        """The catalog's tools for ``account`` in ``format`` (see ``ToolClient.tools``).

        Raises:
            ValueError: unknown format.
            ConnectionFailed: Redis unreachable or failing.
        """
        catalog = yield from self._read(ReadCatalog(None), "the tool catalog")
        return tool_list(catalog, account, format, include_unavailable, metadata)

    def preparing(
        self, function: str, partial: Any, tool_call_id: str | None, index: int
    ) -> Generator[Step, Any, CallEvent]:
        """The ``preparing`` event of a call still being written (see ``ToolClient``).

        Raises:
            ConnectionFailed: Redis unreachable or failing.
        """
        catalog = yield from self._read(ReadCatalog(function), "the tool catalog")
        entry = catalog.entries.get(function)
        return preparing_event(entry, function, partial, tool_call_id=tool_call_id, index=index)

    def extension_errors(self) -> Generator[Step, Any, dict[str, str]]:
        """Extensions the live workers could not load -> why (see ``ToolClient``).

        Raises:
            ConnectionFailed: Redis unreachable or failing.
        """
        fields = yield from self._read(ReadExtensionErrors(), "extension errors")
        return current_errors(fields, self.config.settings.worker_ttl_s)

    def _read(self, step: Step, what: str) -> Generator[Step, Any, Any]:
        try:
            return (yield step)
        except REDIS_FAILURES as exc:
            raise connection_failed(exc, self.config.where, f"reading {what}") from exc

    def cancel(self, call_ids: list[str]) -> Generator[Step, Any, bool]:
        """Cancel calls by id: those this client holds resolve ``canceled``.

        The marker goes first; a call whose worker had already recorded its outcome
        gets that result instead (it had finished). A single id this client does not
        hold is canceled in the fleet, for whoever waits for it: a call whose message is
        still on a catalogued queue (queued, prefetched or running) is answered
        ``canceled`` at once, to its caller's reply list, with its outcome recorded in
        the same script (its worker then neither runs nor answers it); any other gets
        the ``REQUESTED`` marker, and its worker answers it.

        Returns:
            True when a call was canceled (for a call made elsewhere: the cancel took
            effect; False when it had its outcome or Redis could not be reached).
        """
        held = [call_id for call_id in call_ids if self.table.holds(call_id)]
        if held:
            outcomes = yield MarkResolved(held)
            return bool(self.table.expire(held, outcomes, "canceled"))
        if len(call_ids) != 1:
            return False
        try:
            answered = yield from self._cancel_queued(call_ids[0])
        except REDIS_FAILURES as exc:
            log.warning("could not cancel call %s: %s", call_ids[0], exc)
            return False
        if answered is not None:
            return answered
        try:
            finished, marked, _ = yield ForeignCancel(call_ids[0])
        except REDIS_FAILURES as exc:
            log.warning("could not cancel call %s: %s", call_ids[0], exc)
            return False
        return bool(marked) and not finished

    def _cancel_queued(self, call_id: str) -> Generator[Step, Any, bool | None]:
        """Answer a call found on a catalogued queue ``canceled``; ``None``: not found.

        Two round trips, paid by the cancel only (none per call): the message by its id
        in each catalogued queue, then the answering script.

        Raises:
            redis.RedisError, OSError: Redis failed.
        """
        catalog = yield ReadCatalog(None)
        queues = sorted({entry.queue for entry in catalog.typed.values()})
        if not queues:
            return None
        request = queued_request((yield FindQueued(call_id, queues)))
        if request is None or request.id != call_id:
            return None
        ttl_s = self.config.settings.reply_ttl_s
        # the request's reply list is in its group's slot (on a cluster): so are its keys
        prefix = reply_namespace(request.reply_to) or self.config.namespace
        answered = yield AnswerQueued(queued_cancel(prefix, request, ttl_s))
        return bool(answered)

    def _route(
        self, items: list[tuple[str, ToolCallRequest]], catalog: Catalog
    ) -> Generator[Step, Any, list[tuple[str, ToolCallRequest]]]:
        """Where each admitted call goes: its conversation's route (session affinity) or its queue.

        One ``ReadRoutes`` for the calls that carry a conversation to a tool with
        affinity (none: no step at all), and one ``CheckLive`` for slot queues the
        catalog has not read yet. When Redis fails here the calls go to their own queues
        (their publish meets the same Redis).
        """
        wanted = [
            (i, key)
            for i, (queue, r) in enumerate(items)
            if (key := route_key_of(r, catalog, self.prefix_of(queue)))
        ]
        if not wanted:
            return items
        try:
            raws = yield ReadRoutes([key for _, key in wanted], self.config.settings.affinity_ttl_s)
        except REDIS_FAILURES as exc:
            log.warning("could not read conversation routes: %s", exc)
            return items
        routes = {i: decode_route(raw) for (i, _), raw in zip(wanted, raws, strict=True)}
        live: AbstractSet[str] = catalog.live_queues
        first_met = unchecked(routes.values(), catalog)
        if first_met:
            self.slots.add(first_met)
            try:
                counts = yield CheckLive(first_met)
            except REDIS_FAILURES:
                counts = [0] * len(first_met)
            live = live | {q for q, n in zip(first_met, counts, strict=True) if n}
        return [
            routed(request, routes.get(i), queue, live) for i, (queue, request) in enumerate(items)
        ]

    def _publish_batch(
        self,
        state: TurnState,
        batch: Sequence[tuple[int, str, ToolCallRequest]],
        new_future: Callable[[str], ResultFuture],
        catalog: Catalog | Refusal,
        keys: dict[str, Idempotency] | None = None,
    ) -> Generator[Step, Any, None]:
        """Publish a turn's calls in one pipeline (each holds a slot already).

        ``catalog`` is the snapshot that admitted them (their metric labels come from it);
        ``keys``: the idempotency keys of the calls, by request id.
        """
        sent: list[tuple[int, str, ToolCallRequest, ResultFuture, str]] = []
        known = catalog.typed if isinstance(catalog, Catalog) else {}
        for index, queue_name, request in batch:
            future = new_future(request.id)
            label = function_label(request.function, known)
            try:
                self.register(request, future, state.sink(index), label)
            except ClientClosedError:  # closed mid-turn: answered ``rejected``, not sent
                state.answer(index, _result_of(future))
                continue
            sent.append((index, queue_name, request, future, label))
        if not sent:
            return
        try:
            no_breaker = (
                catalog.without_breaker(r.function for _, _, r, _, _ in sent)
                if isinstance(catalog, Catalog)
                else frozenset()
            )
            items = [(q, r) for _, q, r, _, _ in sent]
            outcomes = yield Publish(items, state.deadline, no_breaker, keys or None)
        except Exception as exc:  # noqa: BLE001 - the pipeline failed as a whole
            outcomes = [exc] * len(sent)
        failure: BaseException | None = None
        for (index, _, request, future, label), outcome in zip(sent, outcomes, strict=True):
            try:
                self.published(request, outcome, label, (keys or {}).get(request.id))
            except Exception as exc:  # noqa: BLE001 - raised once the turn is settled
                failure = exc
            if future.done() and outcome is not None:
                state.answer(index, _result_of(future))  # never published: no ``queued``
            else:
                state.published(index, request, future)  # type: ignore[arg-type]
        if failure is not None:
            raise failure


def _result_of(future: Any) -> ToolCallResult:
    result: ToolCallResult = future.result()
    return result
