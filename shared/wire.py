"""Wire models: what travels between producer and workers (pydantic v2, encoded by :mod:`codec`).

A producer publishes one :class:`ToolCallRequest` per tool call; the worker answers
with exactly one :class:`ToolCallResult`, pushed to the request's ``reply_to`` list
inside a :class:`ReplyEnvelope` (``{"type": "result", "result": {...}}``). Progress
and status events use the same list with ``"type": "event"``.

Readers are tolerant: every model here ignores fields it does not know, at the top
level and nested (a request's ``context``, a reply's ``result`` or ``event``), so that a
producer or worker one version ahead can add a field without older peers refusing
its messages mid-rollout (the robustness principle of RFC 1122 §1.2.2; what a
producer *accepts from its caller* is still checked, see ``producer._calls``).

Every field of a request is bounded (:mod:`toolfleet.shared.limits`): the producer builds
and the worker decodes requests through these models, so both refuse the same ones.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from math import isfinite
from typing import Annotated, Any, Literal, NoReturn

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
)
from pydantic_core import PydanticCustomError

from toolfleet.shared import codec
from toolfleet.shared.errors import ERROR_FOR_STATUS
from toolfleet.shared.limits import (
    MAX_DEPTH,
    MAX_ID_CHARS,
    MAX_METADATA_BYTES,
    MAX_NAME_CHARS,
    MAX_REPLY_TO_CHARS,
    MAX_TRACESTATE_CHARS,
)
from toolfleet.shared.shaping import MIN_BUDGET_BYTES
from toolfleet.shared.status import Status

__all__ = [
    "CallContext",
    "ReplyEnvelope",
    "Status",
    "ToolCallRequest",
    "ToolCallResult",
    "ToolEvent",
    "new_call_id",
    "validation_problems",
]


#: The variant digit of a UUID (RFC 4122: bits ``10``) for each random hex digit.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def new_call_id() -> str:
    """A fresh request id: a random UUID4 as a string (unique across every producer).

    What ``str(uuid.uuid4())`` gives (122 random bits from ``os.urandom``, the version
    and variant digits set), written without building a ``UUID`` object.
    """
    h = os.urandom(16).hex()
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}"


def validation_problems(exc: ValidationError) -> str:
    """Each field a wire model refused and why, without its value.

    E.g. ``context.user: String should have at most 256 characters`` (the bounds of
    :mod:`toolfleet.shared.limits`); several are joined with ``; ``.
    """
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or 'value'}: {error['msg']}"
        for error in exc.errors(include_url=False, include_input=False)
    )


def _at_most(limit: int) -> Callable[[str], str]:
    """A check that a string holds at most ``limit`` characters (``len``).

    Not pydantic's ``max_length``: that refuses a string holding a lone surrogate, which
    a request may carry (the worker replaces or refuses it with a clear answer).
    """

    def check(value: str) -> str:
        if len(value) > limit:
            raise PydanticCustomError(
                "string_too_long",
                "String should have at most {max_length} characters",
                {"max_length": limit},
            )
        return value

    return check


#: The types a plain arguments object's keys may be (``set(map(type, keys)) <=`` this).
_STR_ONLY = frozenset({str})
#: The fields :meth:`ToolCallRequest.made` is given (validation marks them set).
_MADE_FIELDS = frozenset(
    {"id", "tool_call_id", "function", "arguments", "context", "reply_to", "deadline",
     "timeout_s", "sent_at", "events", "max_result_bytes", "schema_hash"}
)  # fmt: skip


#: Text of at most :data:`~toolfleet.shared.limits.MAX_NAME_CHARS` characters.
NameText = Annotated[str, AfterValidator(_at_most(MAX_NAME_CHARS))]


class CallContext(BaseModel):
    """Who and what a call is for; handed to the tool, never used as a key.

    Attributes:
        account: the customer account (availability rules key on it).
        user: the end user in the conversation.
        llmclient: which model/client produced the call (e.g. ``"openai/gpt-4o"``).
        conversation: the conversation id.
        traceparent: a W3C ``traceparent`` header value, carried into logs and spans (the
            producer fills it in from the current OpenTelemetry context, if any).
        tracestate: the W3C ``tracestate`` header value that goes with it.
        metadata: free JSON object.

    Bounds (:mod:`toolfleet.shared.limits`): ``account``, ``user``, ``llmclient``,
    ``conversation`` and ``traceparent`` at most ``MAX_NAME_CHARS`` (256) characters,
    ``tracestate`` at most ``MAX_TRACESTATE_CHARS``, ``metadata`` at most
    ``MAX_METADATA_BYTES`` (64 KiB) encoded and nested within the request's
    ``MAX_DEPTH``. An instance is validated again wherever a request takes it, so one
    changed after it was built is still checked.
    """

    model_config = ConfigDict(extra="ignore", revalidate_instances="always")

    account: NameText | None = None
    user: NameText | None = None
    llmclient: NameText | None = None
    conversation: NameText | None = None
    traceparent: NameText | None = None
    tracestate: Annotated[str, AfterValidator(_at_most(MAX_TRACESTATE_CHARS))] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def default(cls) -> CallContext:
        """``CallContext()``: no field set, empty ``metadata`` (made without validation)."""
        context = cls.__new__(cls)
        _set = object.__setattr__
        _set(context, "__dict__", {
            "account": None, "user": None, "llmclient": None, "conversation": None,
            "traceparent": None, "tracestate": None, "metadata": {},
        })  # fmt: skip
        _set(context, "__pydantic_fields_set__", set())
        _set(context, "__pydantic_extra__", None)
        _set(context, "__pydantic_private__", None)
        return context

    @field_validator("metadata")
    @classmethod
    def _bounded_metadata(cls, metadata: dict[str, Any]) -> dict[str, Any]:
        if not metadata:
            return metadata
        try:  # the request and its context are the two levels above it
            size = len(codec.dumps(metadata, max_depth=MAX_DEPTH - 2))
        except codec.EncodeError as exc:
            raise ValueError(f"metadata is not JSON a request can carry: {exc}") from None
        if size > MAX_METADATA_BYTES:
            raise ValueError(
                f"metadata is {size} bytes encoded, over the limit of {MAX_METADATA_BYTES} bytes"
            )
        return metadata


class ToolCallRequest(BaseModel):
    """One tool call, as published to a queue.

    Attributes:
        id: producer-generated UUID; unique across every conversation and customer.
        tool_call_id: the model's own id (e.g. ``call_0``), carried through untouched.
        function: the function name, e.g. ``ext_bfcl_math_factorial``.
        arguments: a JSON object, or the raw JSON string the model produced (the worker
            parses it so that a parse error goes back to the model).
        context: see :class:`CallContext`.
        reply_to: the Redis list the result is pushed to.
        deadline: Unix epoch seconds after which nobody waits for the result.
        timeout_s: the caller's time budget in seconds.
        sent_at: Unix epoch seconds when the producer published the call.
        events: when true the worker posts ``running`` and ``progress`` events to
            ``reply_to`` before the result (a producer streaming the call's status).
        identity: the tool the producer's catalog listed ``function`` as, ``<slug>/<tool>``
            (:func:`toolfleet.shared.naming.tool_identity`); a worker serving another tool
            under that name refuses the call. ``None`` from older producers: not checked.
        schema_hash: the schema hash the caller's model was shown
            (:func:`toolfleet.shared.catalog_life.schema_hash`); a worker whose tool has
            another schema refuses the call before running it. ``None``: not pinned.
        session_holder: for a conversation's call to a tool with session affinity, the
            worker process (``host:pid``) its route names as holding the session, when
            the producer read one (:mod:`toolfleet.shared.affinity`).
        max_result_bytes: the most bytes the result may take encoded (the model's
            context budget for it), at least 64; ``None``: the worker's own limit. The
            smaller of the two applies; over it, the tool's ``result_shaping`` decides
            (``error``: a ``tool_error``; ``truncate``: the result cut to fit, see
            :mod:`toolfleet.shared.shaping`).

    Bounds (:mod:`toolfleet.shared.limits`): ``id`` at most ``MAX_ID_CHARS`` (128)
    characters, ``tool_call_id`` and ``function`` at most ``MAX_NAME_CHARS`` (256),
    ``reply_to`` at most ``MAX_REPLY_TO_CHARS`` (1,024); ``arguments`` nested within
    ``MAX_DEPTH`` (:meth:`arguments_size`; their size is the ``max_arguments_bytes``
    setting); the whole encoded document at most ``MAX_DEPTH`` (1,024) levels deep.
    """

    model_config = ConfigDict(extra="ignore")

    id: Annotated[str, AfterValidator(_at_most(MAX_ID_CHARS))]
    tool_call_id: NameText | None = None
    function: NameText
    arguments: dict[str, Any] | str | None = None
    context: CallContext = Field(default_factory=CallContext)
    reply_to: Annotated[str, AfterValidator(_at_most(MAX_REPLY_TO_CHARS))]
    deadline: float = Field(allow_inf_nan=False)
    timeout_s: float = Field(allow_inf_nan=False)
    sent_at: float = Field(default_factory=time.time)
    events: bool = False
    identity: NameText | None = None
    schema_hash: NameText | None = None
    session_holder: NameText | None = None
    max_result_bytes: int | None = Field(default=None, ge=MIN_BUDGET_BYTES)
    #: the arguments object :meth:`arguments_size` encoded, and its encoding (reused by
    #: :meth:`encode` while ``arguments`` is still that object: encoded once)
    _encoded_arguments: tuple[Any, bytes] | None = PrivateAttr(default=None)

    def arguments_size(self) -> int:
        """Bytes ``arguments`` take on the wire (0 for none).

        Raises:
            codec.EncodeError: an object that is not JSON, or nests deeper than
                ``MAX_DEPTH - 1`` levels (the request around it is the first).
        """
        arguments = self.arguments
        if arguments is None:
            return 0
        if isinstance(arguments, str):
            return len(arguments.encode("utf-8", "surrogatepass"))
        encoded = codec.dumps(arguments, max_depth=MAX_DEPTH - 1)
        self.__pydantic_private__["_encoded_arguments"] = (arguments, encoded)  # type: ignore[index]
        return len(encoded)

    @classmethod
    def made(
        cls,
        *,
        id: str,  # noqa: A002 - the field's name
        function: str,
        arguments: dict[str, Any] | str | None,
        context: CallContext,
        reply_to: str,
        deadline: float,
        timeout_s: float,
        sent_at: float,
        tool_call_id: str | None = None,
        events: bool = False,
        max_result_bytes: int | None = None,
        schema_hash: str | None = None,
        context_checked: bool = False,
    ) -> ToolCallRequest:
        """``ToolCallRequest(...)`` of these fields, as the producer builds each call.

        When every value is one validation keeps as it is (exact ``str``, ``float``,
        ``bool`` and ``int`` within their bounds, a ``dict`` with ``str`` keys, which is
        copied as validation copies it), the request is made without running pydantic's
        validators; any other value goes through the model's validation, which converts it
        or raises as the constructor does. The keyword arguments are the fields (see the
        class) and ``context_checked``: ``context`` was just made by ``CallContext``'s own
        validation and its caller does not hold it (else it is validated again, as the
        model does with every ``CallContext`` it is given).

        Raises:
            pydantic.ValidationError: a field the model refuses.
        """
        plain = (
            cls is ToolCallRequest
            and context_checked
            and type(context) is CallContext
            and type(id) is str
            and len(id) <= MAX_ID_CHARS
            and type(function) is str
            and len(function) <= MAX_NAME_CHARS
            and (
                tool_call_id is None
                or (type(tool_call_id) is str and len(tool_call_id) <= MAX_NAME_CHARS)
            )
            and (
                schema_hash is None
                or (type(schema_hash) is str and len(schema_hash) <= MAX_NAME_CHARS)
            )
            and type(reply_to) is str
            and len(reply_to) <= MAX_REPLY_TO_CHARS
            and type(deadline) is float
            and isfinite(deadline)
            and type(timeout_s) is float
            and isfinite(timeout_s)
            and type(sent_at) is float
            and isfinite(sent_at)
            and type(events) is bool
            and (
                max_result_bytes is None
                or (type(max_result_bytes) is int and max_result_bytes >= MIN_BUDGET_BYTES)
            )
        )
        if plain and type(arguments) is dict:
            plain = set(map(type, arguments)) <= _STR_ONLY  # exact str keys (no frame)
            arguments = dict(arguments)  # validation's copy
        elif plain:
            plain = arguments is None or type(arguments) is str
        if not plain:
            return cls(
                id=id,
                tool_call_id=tool_call_id,
                function=function,
                arguments=arguments,
                context=context,
                reply_to=reply_to,
                deadline=deadline,
                timeout_s=timeout_s,
                sent_at=sent_at,
                events=events,
                max_result_bytes=max_result_bytes,
                schema_hash=schema_hash,
            )
        request = cls.__new__(cls)
        # the instance validation would make: every field in declaration order, those
        # given marked set, no extra, the private attribute at its default
        values = {
            "id": id,
            "tool_call_id": tool_call_id,
            "function": function,
            "arguments": arguments,
            "context": context,
            "reply_to": reply_to,
            "deadline": deadline,
            "timeout_s": timeout_s,
            "sent_at": sent_at,
            "events": events,
            "identity": None,
            "schema_hash": schema_hash,
            "session_holder": None,
            "max_result_bytes": max_result_bytes,
        }
        _set = object.__setattr__
        _set(request, "__dict__", values)
        _set(request, "__pydantic_fields_set__", set(_MADE_FIELDS))
        _set(request, "__pydantic_extra__", None)
        _set(request, "__pydantic_private__", {"_encoded_arguments": None})
        return request

    def __eq__(self, other: object) -> bool:
        """Equal fields (what :meth:`arguments_size` kept of its work is not compared)."""
        if not isinstance(other, ToolCallRequest):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # a mutable model, as pydantic's

    def encode(self) -> bytes:
        """Encode for the wire (orjson; exact big integers).

        Arguments that :meth:`arguments_size` encoded already (the same object, not
        replaced since) are not encoded again: their bytes go in as they are.
        """
        private = self.__pydantic_private__
        cached: tuple[Any, bytes] | None = private.get("_encoded_arguments") if private else None
        if cached is None or cached[0] is not self.arguments:
            return codec.dumps(self.model_dump(mode="python", exclude_none=True))
        rest = codec.dumps(self._dumped_without_arguments())
        return b'{"arguments":' + cached[1] + (b"," + rest[1:] if len(rest) > 2 else b"}")

    def _dumped_without_arguments(self) -> dict[str, Any]:
        """``model_dump(mode="python", exclude_none=True, exclude={"arguments"})``.

        Read straight from the fields when they are what that dump returns as they are
        (every field but ``context`` is text, a number, a flag or ``None``; a context
        without ``metadata`` holds text or ``None``), else pydantic's dump.
        """
        context = self.context
        if (
            type(self) is not ToolCallRequest
            or type(context) is not CallContext
            or context.metadata
        ):
            return self.model_dump(mode="python", exclude_none=True, exclude={"arguments"})
        dumped = {k: v for k, v in self.__dict__.items() if v is not None and k != "arguments"}
        dumped["context"] = {k: v for k, v in context.__dict__.items() if v is not None}
        return dumped

    @classmethod
    def decode(cls, data: bytes | str) -> ToolCallRequest:
        """Decode from the wire.

        Raises:
            codec.DecodeError: not JSON.
            pydantic.ValidationError: JSON, but not a request.
        """
        return cls.model_validate(codec.loads(data))


class ToolCallResult(BaseModel):
    """The one terminal answer to a :class:`ToolCallRequest`.

    Attributes:
        id: the request id.
        tool_call_id: the model's id, copied from the request.
        function: the function name, copied from the request.
        status: see :class:`Status`.
        content: the JSON value the model reads: the tool's result, or
            ``{"error": "<message>"}`` for every status but ``ok``.
        queued_s: seconds between publishing and a worker taking the call.
        run_s: seconds the tool ran.
        worker: ``host:pid`` of the worker process that answered, if any.
        description: the tool's own words for the outcome, for a user interface (e.g.
            "Fetched the weather for Paris"), when the tool defines them.
        route: for a tool with session affinity, the queue the conversation's next
            calls should go to (only the worker slot holding its state consumes it);
            see :mod:`toolfleet.producer.affinity`.
        duplicate_of: for a call submitted again under an idempotency key, the id of the
            call the key was first used for, whose outcome this is (nothing ran for this
            one); see :mod:`toolfleet.shared.idempotency`.
        shaped: ``True`` when the worker cut the result to fit its byte budget
            (``result_shaping = "truncate"``); ``None`` otherwise.
        problems: ``(field, reason)`` of each failing argument of an
            ``invalid_arguments`` result, for the worker's own aggregates; never encoded
            (not on the wire), empty elsewhere.
    """

    model_config = ConfigDict(extra="ignore")

    id: str
    tool_call_id: str | None = None
    function: str
    status: Status
    content: Any = None
    queued_s: float | None = None
    run_s: float | None = None
    worker: str | None = None
    description: str | None = None
    route: str | None = None
    duplicate_of: str | None = None
    shaped: bool | None = None
    problems: tuple[tuple[str, str], ...] = Field(default=(), exclude=True)

    @property
    def ok(self) -> bool:
        """True when ``status`` is ``ok``."""
        return self.status is Status.OK

    @property
    def error(self) -> str | None:
        """The error message of a non-``ok`` result, else ``None``."""
        if self.ok:
            return None
        if isinstance(self.content, dict) and isinstance(self.content.get("error"), str):
            return str(self.content["error"])
        return str(self.content)

    def raise_for_status(self) -> ToolCallResult:
        """Raise the error class of a non-``ok`` status; return ``self`` when ``ok``.

        Raises:
            toolfleet.shared.errors.ToolCallError: the subclass mapped to ``status``
                (e.g. ``ToolTimeoutError`` for ``timeout``), carrying this result.
        """
        if self.ok:
            return self
        self._raise()

    def _raise(self) -> NoReturn:
        error_class = ERROR_FOR_STATUS[self.status]
        raise error_class(self.error or self.status.value, result=self)

    @classmethod
    def answering(
        cls, request: ToolCallRequest, status: Status, content: Any, **timings: Any
    ) -> ToolCallResult:
        """Build the result for ``request`` with ``status`` and ``content``.

        ``id``, ``tool_call_id`` and ``function`` are copied from ``request``;
        ``timings`` are further fields (e.g. ``queued_s=0.0``, in seconds).
        """
        return cls(
            id=request.id,
            tool_call_id=request.tool_call_id,
            function=request.function,
            status=status,
            content=content,
            **timings,
        )

    @classmethod
    def failure(
        cls, request: ToolCallRequest, status: Status, message: str, **timings: Any
    ) -> ToolCallResult:
        """Build a non-``ok`` result for ``request`` with content ``{"error": message}``."""
        return cls.answering(request, status, {"error": message}, **timings)


class ToolEvent(BaseModel):
    """A status event of one call, posted before its result.

    Attributes:
        id: the request id.
        kind: ``running`` (a worker started it) or ``progress`` (the tool reported).
        description: human-readable text for a user interface, if any.
        at: Unix epoch seconds when it happened.
        canceled_description: on ``running``, the tool's ``canceled_description`` for
            these arguments, computed when it starts: a producer that resolves a cancel
            itself (at once, without waiting for the worker) still shows it.
    """

    model_config = ConfigDict(extra="ignore")

    id: str
    kind: Literal["running", "progress"]
    description: str | None = None
    at: float = Field(default_factory=time.time)
    canceled_description: str | None = None


class ReplyEnvelope(BaseModel):
    """One entry of a reply list: a terminal ``result`` or an ``event`` before it."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["result", "event"]
    result: ToolCallResult | None = None
    event: ToolEvent | None = None

    def encode(self) -> bytes:
        """Encode for the wire."""
        return codec.dumps(self.model_dump(mode="python", exclude_none=True))

    @classmethod
    def decode(cls, data: bytes | str) -> ReplyEnvelope:
        """Decode one reply-list entry (raises like :meth:`ToolCallRequest.decode`)."""
        return cls.model_validate(codec.loads(data))
