"""What both clients do before publishing a call: build the request, then admit or refuse it.

A refused call is answered by the producer itself, at once, and nothing is published:
``rejected`` (arguments over ``max_arguments_bytes``, queue at ``max_queue_length``),
``unknown_function`` (absent from the catalog), ``not_available`` (no live worker,
disabled, switched off, or not for this account; Redis unreachable) or ``timeout`` (the
call's deadline came before the catalog could be read).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis
from pydantic import ValidationError

from toolfleet.producer._redis import DeadlinePassed
from toolfleet.producer.backpressure import QueueLengths
from toolfleet.producer.catalog import Catalog
from toolfleet.producer.turns import TurnCall, duplicate_message
from toolfleet.shared import codec
from toolfleet.shared.catalog import Refusal
from toolfleet.shared.errors import ClientError
from toolfleet.shared.limits import MAX_DEPTH, MAX_NAME_CHARS, timeout_problem
from toolfleet.shared.settings import Settings
from toolfleet.shared.shaping import MIN_BUDGET_BYTES
from toolfleet.shared.wire import (
    CallContext,
    Status,
    ToolCallRequest,
    ToolCallResult,
    new_call_id,
    validation_problems,
)

__all__ = [
    "Arguments",
    "Refusal",
    "admit",
    "arguments_size",
    "build_request",
    "catalog_refusal",
    "check_idempotency_key",
    "check_timeout",
    "local_result",
    "make_context",
    "never_sent",
    "prepare_turn_call",
    "publish_refusal",
    "REDIS_FAILURES",
]

#: What ``submit`` accepts as arguments: a JSON object, the model's raw JSON string, none.
Arguments = dict[str, Any] | str | None


#: What a caller reads while no worker has published the catalog (a Redis restart without
#: persistence empties it until the next heartbeat): a retryable ``not_available``, never
#: ``unknown_function``, which would tell a model that a served tool does not exist.
CATALOG_EMPTY = "the tool catalog is empty (no worker has published it yet); retry shortly"


def check_budget(max_result_bytes: Any) -> int | None:
    """``max_result_bytes`` checked: ``None``, or an integer of at least 64 (bytes).

    Raises:
        ClientError: anything else.
    """
    if max_result_bytes is None:
        return None
    if (
        isinstance(max_result_bytes, bool)
        or not isinstance(max_result_bytes, int)
        or max_result_bytes < MIN_BUDGET_BYTES
    ):
        raise ClientError(f"max_result_bytes must be an integer of at least {MIN_BUDGET_BYTES}")
    return max_result_bytes


def check_timeout(timeout_s: Any) -> float:
    """``timeout_s`` as a float.

    Raises:
        ClientError: not a positive, finite number of seconds of at most
            :data:`~toolfleet.shared.limits.MAX_TIMEOUT_S` (one day).
    """
    problem = timeout_problem(timeout_s)
    if problem:
        raise ClientError(problem)
    return float(timeout_s)


def check_idempotency_key(key: Any) -> str:
    """``key`` as an idempotency key (:mod:`toolfleet.shared.idempotency`).

    Raises:
        ClientError: not a non-empty string of at most ``MAX_NAME_CHARS`` (256) characters.
    """
    if not isinstance(key, str) or not key or len(key) > MAX_NAME_CHARS:
        raise ClientError(
            f"idempotency_key must be a non-empty string of at most {MAX_NAME_CHARS} characters"
        )
    return key


def make_context(context: CallContext | dict[str, Any] | None) -> CallContext:
    """A :class:`CallContext` from an object, a dict of its fields, or ``None``.

    Raises:
        ClientError: a field that is not a ``CallContext`` field, or of the wrong type; an
            ``account`` that is not valid Unicode (a lone surrogate): it names Redis keys.
    """
    if context is None:
        return CallContext.default()
    built = context if isinstance(context, CallContext) else _context_from(context)
    try:
        (built.account or "").encode("utf-8")
    except UnicodeEncodeError:
        raise ClientError("bad context: account holds a lone surrogate") from None
    return built


def _context_from(context: Any) -> CallContext:
    if context is not None and not isinstance(context, dict):
        raise ClientError("context must be a CallContext, a dict of its fields or None")
    # the wire model ignores unknown fields (tolerant reader); a caller's typo is misuse
    unknown = sorted(set(context or {}) - set(CallContext.model_fields))
    if unknown:
        raise ClientError(f"bad context: unknown field(s) {', '.join(map(str, unknown))}")
    try:
        return CallContext(**(context or {}))
    except ValidationError as exc:
        raise ClientError(f"bad context: {validation_problems(exc)}") from None
    except Exception as exc:
        raise ClientError(f"bad context: {exc}") from exc


def build_request(
    function: Any,
    arguments: Any,
    *,
    tool_call_id: Any,
    context: CallContext,
    timeout_s: float,
    reply_to: str,
    deadline: float | None = None,
    events: bool = False,
    call_id: str | None = None,
    max_result_bytes: int | None = None,
    schema_hash: str | None = None,
    context_checked: bool = False,
) -> ToolCallRequest:
    """A new :class:`ToolCallRequest` with a fresh id (or ``call_id``).

    Args:
        function: the function name.
        arguments: a JSON object, the raw JSON string, or ``None``.
        tool_call_id: the model's id, or ``None``.
        context: the call's context.
        timeout_s: the caller's budget, seconds (already checked).
        reply_to: the client's reply list.
        deadline: Unix epoch seconds; ``now + timeout_s`` when ``None``.
        events: ask the worker for ``running``/``progress`` events.
        call_id: the request id to use, a UUID in its canonical form the caller derives
            so that any client can cancel the call by it (unique across every call, as
            all exactly-once bookkeeping keys on it); ``None``: a fresh random one.
        max_result_bytes: the most bytes the result may take encoded (at least 64), or
            ``None`` for the worker's limit.
        schema_hash: the schema hash the caller's model was shown (from the exported
            tool's metadata); a worker whose tool's schema differs refuses the call.
        context_checked: ``context`` was made by :func:`make_context` from ``None`` or a
            dict (validated, and not the caller's object, which the caller could change):
            the request does not validate it again.

    Raises:
        ClientError: a bad function name, arguments, tool_call_id, call_id or schema_hash,
            or a field over its bound (:mod:`toolfleet.shared.limits`; the message names the field).
    """
    if not isinstance(function, str) or not function:
        raise ClientError("function must be a non-empty string")
    if arguments is not None and not isinstance(arguments, (dict, str)):
        raise ClientError("arguments must be a dict, a JSON string or None")
    if tool_call_id is not None and not isinstance(tool_call_id, str):
        raise ClientError("tool_call_id must be a string")
    if call_id is not None and not _canonical_uuid(call_id):
        raise ClientError("call_id must be a UUID string in canonical form")
    if schema_hash is not None and not isinstance(schema_hash, str):
        raise ClientError("schema_hash must be a string")
    now = time.time()
    try:
        return ToolCallRequest.made(
            id=call_id or new_call_id(),
            tool_call_id=tool_call_id,
            function=function,
            arguments=arguments,
            context=context,
            reply_to=reply_to,
            deadline=now + timeout_s if deadline is None else deadline,
            timeout_s=timeout_s,
            sent_at=now,
            events=events,
            max_result_bytes=max_result_bytes,
            schema_hash=schema_hash,
            context_checked=context_checked,
        )
    except ValidationError as exc:
        raise ClientError(f"bad call: {validation_problems(exc)}") from None
    except ValueError as exc:
        raise ClientError(f"bad call: {exc}") from None


def _canonical_uuid(value: Any) -> bool:
    """True for a UUID string as ``str(uuid.UUID(...))`` writes it (it names Redis keys)."""
    try:
        return isinstance(value, str) and str(uuid.UUID(value)) == value
    except ValueError:
        return False


def arguments_size(request: ToolCallRequest) -> int:
    """Bytes the request's arguments take on the wire (``ToolCallRequest.arguments_size``).

    Raises:
        ClientError: a dict that is not JSON (a set, an object, NaN...), or nested so deep
            that the request would nest deeper than
            :data:`~toolfleet.shared.limits.MAX_DEPTH` levels (a worker cannot read it).
    """
    try:
        return request.arguments_size()
    except codec.EncodeError as exc:
        if codec.depth_exceeds(request.arguments, MAX_DEPTH - 1):
            raise ClientError(
                f"arguments nest deeper than {MAX_DEPTH - 1} levels: a request (the first "
                f"level) may nest at most {MAX_DEPTH} levels of arrays and objects"
            ) from None
        raise ClientError(f"arguments are not JSON: {exc}") from None


def admit(
    request: ToolCallRequest,
    catalog: Catalog,
    settings: Settings,
    lengths: QueueLengths,
) -> str | Refusal:
    """The queue to publish ``request`` on, or why the producer answers it itself.

    Checks, in order: argument size, a catalog entry, a live worker (and enabled,
    switched on, available to the account), then room in the queue (which reserves one
    message of it in ``lengths``). A conversation's call to a tool with session
    affinity may then go to its route instead (:mod:`toolfleet.producer.affinity`).
    An admitted request is given the identity of the tool the catalog lists its name as
    (``request.identity``), so that no worker serving another tool under that name runs it.

    Raises:
        ClientError: arguments that are not JSON.
    """
    size = arguments_size(request)
    if size > settings.max_arguments_bytes:
        message = (
            f"the arguments are {size} bytes, over the limit of "
            f"{settings.max_arguments_bytes} bytes"
        )
        return Refusal(Status.REJECTED, message)
    if not catalog.entries:
        return Refusal(Status.NOT_AVAILABLE, CATALOG_EMPTY)
    refusal = catalog.refusal(request.function, request.context.account)
    if refusal is not None:
        return refusal
    queue = catalog.typed[request.function].queue
    request.identity = catalog.identity_of(request.function)
    held = lengths.reserve(catalog, queue)
    if held is not None:
        message = (
            f"queue {queue} holds {held} calls, at its limit of {lengths.limit} "
            "(TOOLFLEET_MAX_QUEUE_LENGTH): the fleet is overloaded, try again later"
        )
        return Refusal(Status.REJECTED, message)
    return queue


def local_result(request: ToolCallRequest, status: Status, message: str) -> ToolCallResult:
    """A result the producer gives itself (nothing was published)."""
    return ToolCallResult.failure(request, status, message, queued_s=0.0)


def never_sent(exc: BaseException) -> bool:
    """True when redis-py failed to connect (the command cannot have reached Redis)."""
    if not isinstance(exc, redis.ConnectionError):
        return False
    return "connecting to" in str(exc) or isinstance(exc.__cause__, ConnectionRefusedError)


#: What a Redis command can raise (redis.asyncio lets some socket errors through bare; a
#: cluster client whose nodes are all gone raises ``RedisClusterException``, no RedisError).
REDIS_FAILURES = (redis.RedisError, redis.exceptions.RedisClusterException, OSError)


def publish_refusal(exc: BaseException) -> Refusal | None:
    """How to answer a call whose publish raised ``exc``; ``None`` when it may have run.

    A connection never made (``not_available``) or a command Redis refused
    (``rejected``) cannot have published the call; any other Redis failure may have
    (the reply may still come: the deadline settles it). An error that is not Redis's
    (a bug, a closed client) is answered ``rejected``: the call was not published.
    """
    if never_sent(exc):
        return Refusal(Status.NOT_AVAILABLE, f"Redis unreachable: {exc}")
    if isinstance(exc, redis.ResponseError):
        return Refusal(Status.REJECTED, f"Redis refused the call: {exc}")
    if isinstance(exc, REDIS_FAILURES):
        return None
    return Refusal(Status.REJECTED, "the call was not published")


def catalog_refusal(exc: BaseException, timeout_s: float) -> Refusal:
    """How to answer a call whose catalog read raised ``exc`` (nothing was published).

    The rule for budgets (README "Time budgets"): a valid budget, however short, is
    answered ``timeout`` when its deadline ends the wait (:class:`DeadlinePassed`), as at
    any deadline; only a failure of Redis itself is ``not_available``.

    Args:
        exc: what reading the catalog raised (a Redis failure).
        timeout_s: the call's budget, seconds.
    """
    if isinstance(exc, DeadlinePassed):
        message = (
            f"no reply within {timeout_s:.3g} s: the deadline passed before the catalog was read"
        )
        return Refusal(Status.TIMEOUT, message)
    return Refusal(Status.NOT_AVAILABLE, f"Redis unreachable: {exc}")


def turn_share(max_result_bytes: int | None, calls: int) -> int | None:
    """Each call's share of a turn's result budget: an equal part, at least 64 bytes.

    The calls of a turn run at once on any workers, so the budget is split before they
    are published: ``max_result_bytes // calls``, never below
    :data:`toolfleet.shared.shaping.MIN_BUDGET_BYTES` (then the turn may take up to
    64 bytes per call).

    Args:
        max_result_bytes: the turn's budget for all its results, bytes, or ``None``.
        calls: how many calls the turn has.
    """
    if max_result_bytes is None:
        return None
    return max(MIN_BUDGET_BYTES, max_result_bytes // max(1, calls))


def prepare_turn_call(
    call: TurnCall,
    *,
    context: CallContext,
    timeout_s: float,
    deadline: float,
    events: bool,
    reply_to: str,
    catalog: Catalog | Refusal,
    settings: Settings,
    lengths: QueueLengths,
    max_result_bytes: int | None = None,
    context_checked: bool = False,
) -> ToolCallResult | tuple[str, ToolCallRequest]:
    """A turn's call, ready to publish as ``(queue, request)``, or answered at once.

    Args:
        call: the call.
        context: the turn's context.
        timeout_s: the turn's budget, seconds.
        deadline: the turn's deadline, Unix epoch seconds.
        events: ask the worker for status events.
        reply_to: the client's reply list.
        catalog: the catalog snapshot, or how to answer every call when it could not be
            read (:func:`catalog_refusal`).
        settings: the client's settings.
        lengths: the queue-length accounting.
        max_result_bytes: this call's share of the turn's result budget, bytes, or ``None``.
        context_checked: ``context`` is :func:`make_context`'s own (see :func:`build_request`).
    """
    if call.duplicate_of is not None:
        return ToolCallResult(
            id=new_call_id(),
            tool_call_id=call.tool_call_id,
            function=call.function,
            status=Status.REJECTED,
            content={"error": duplicate_message(call)},
            queued_s=0.0,
        )
    if call.problem:
        return ToolCallResult(
            id=new_call_id(),
            tool_call_id=call.tool_call_id or None,
            function=call.function,
            status=Status.REJECTED,
            content={"error": f"tool call {call.index} of the turn is malformed: {call.problem}"},
            queued_s=0.0,
        )
    try:
        request = build_request(
            call.function,
            call.arguments,
            tool_call_id=call.tool_call_id,
            context=context,
            timeout_s=timeout_s,
            reply_to=reply_to,
            deadline=deadline,
            max_result_bytes=max_result_bytes,
            events=events,
            context_checked=context_checked,
        )
    except ClientError as exc:  # a field over its bound (the turn checked the rest)
        return ToolCallResult(
            id=new_call_id(),
            tool_call_id=call.tool_call_id or None,
            function=call.function,
            status=Status.REJECTED,
            content={"error": str(exc)},
            queued_s=0.0,
        )
    if isinstance(catalog, Refusal):
        return local_result(request, catalog.status, catalog.message)
    try:
        admitted = admit(request, catalog, settings, lengths)
    except ClientError as exc:
        return local_result(request, Status.REJECTED, str(exc))
    if isinstance(admitted, Refusal):
        return local_result(request, admitted.status, admitted.message)
    return admitted, request
