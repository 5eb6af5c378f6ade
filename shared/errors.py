"""The toolfleet error tree.

One root, at most two levels below it::

    ToolfleetError                     root of everything toolfleet raises
    ├── ClientError                    misuse of a client (closed client, bad method arguments)
    │   ├── ClientClosedError
    │   ├── BackpressureError          too many calls in flight: no slot within submit_timeout_s
    │   └── IdempotencyKeyError        an idempotency key reused for a different call
    ├── ConfigurationError             bad settings, bad extension or tool definition
    ├── ConnectionFailed               Redis could not be reached or answered with an error
    └── ToolCallError                  a non-``ok`` wire status; carries the ToolCallResult
        ├── ExtensionToolError         tool_error        (raised by tool code: the model reads it)
        ├── InvalidArgumentsError      invalid_arguments
        ├── UnknownFunctionError       unknown_function
        ├── NotAvailableError          not_available
        ├── ToolTimeoutError           timeout
        ├── CanceledError              canceled
        ├── ExpiredError               expired
        ├── CrashedError               crashed
        └── RejectedError              rejected

Each wire status maps to exactly one class (:data:`ERROR_FOR_STATUS`), so
``ToolCallResult.raise_for_status()`` is mechanical.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from toolfleet.shared.status import Status

if TYPE_CHECKING:
    from toolfleet.shared.wire import ToolCallResult

__all__ = [
    "ERROR_FOR_STATUS",
    "BackpressureError",
    "CanceledError",
    "ClientClosedError",
    "ClientError",
    "ConfigurationError",
    "ConnectionFailed",
    "CrashedError",
    "ExpiredError",
    "ExtensionToolError",
    "IdempotencyKeyError",
    "InvalidArgumentsError",
    "NotAvailableError",
    "RejectedError",
    "ToolCallError",
    "ToolTimeoutError",
    "ToolfleetError",
    "UnknownFunctionError",
]


class ToolfleetError(Exception):
    """Root of every error toolfleet raises."""


class ClientError(ToolfleetError):
    """A client was used wrongly (bad arguments to a method, wrong state)."""


class ClientClosedError(ClientError):
    """A call was made on a client after ``close()``."""


class BackpressureError(ClientError):
    """A client already has ``max_in_flight`` calls in flight and none resolved in time.

    Raised by ``submit``/``call`` after waiting ``submit_timeout_s`` seconds for a slot;
    nothing was published. Slow down, raise the client's ``max_in_flight``, or add workers.
    """


class IdempotencyKeyError(ClientError):
    """An idempotency key was used again, within its lifetime, for a different call.

    A key names one call (:mod:`toolfleet.shared.idempotency`): the same key with another
    function or other arguments is misuse, refused in the enqueue script; nothing was
    published. The call's future is answered ``rejected`` with the same message.
    """


class ConfigurationError(ToolfleetError):
    """Settings, an extension or a tool definition is invalid."""


class ConnectionFailed(ToolfleetError):
    """Redis could not be reached, or failed a command, at a toolfleet boundary.

    Raised instead of a bare ``redis`` exception by every public method that talks to
    Redis outside a tool call's own result (a call's outcome is always a status).

    Attributes:
        url: the Redis URL with any password replaced by ``***`` (safe to print), or ``""``.
    """

    def __init__(self, message: str, *, url: str = "") -> None:
        super().__init__(message)
        self.url = url


class ToolCallError(ToolfleetError):
    """A tool call ended with a non-``ok`` status.

    Attributes:
        result: the :class:`~toolfleet.shared.wire.ToolCallResult` that carried the
            status, or ``None`` when the error was raised by tool code itself.
    """

    #: the status this error stands for (``None`` only on this base class)
    status: ClassVar[Status | None] = None

    def __init__(self, message: str = "", *, result: ToolCallResult | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.message,))


class ExtensionToolError(ToolCallError):
    """Raised by tool code to report a failure the model should read.

    ``raise ExtensionToolError("city not found")`` becomes a ``tool_error`` reply whose
    content is ``{"error": "city not found"}``, with no traceback.
    """

    status = Status.TOOL_ERROR


class InvalidArgumentsError(ToolCallError):
    """``invalid_arguments``: the arguments did not parse or validate.

    Attributes:
        problems: ``(field, reason)`` of each failing argument, as the worker's
            validation found them (``reason`` one of
            :data:`toolfleet.shared.aggregates.REASONS`; ``field`` a dotted path, list
            positions as ``*``, or ``(arguments)`` for the arguments as a whole); empty
            when not known (an error re-raised from a result).
    """

    status = Status.INVALID_ARGUMENTS

    def __init__(
        self,
        message: str = "",
        *,
        result: ToolCallResult | None = None,
        problems: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message, result=result)
        self.problems = problems


class UnknownFunctionError(ToolCallError):
    """``unknown_function``: no tool of that name exists in the fleet."""

    status = Status.UNKNOWN_FUNCTION


class NotAvailableError(ToolCallError):
    """``not_available``: the tool exists but no live worker serves it, or not for this account."""

    status = Status.NOT_AVAILABLE


class ToolTimeoutError(ToolCallError):
    """``timeout``: no result within the time limit or the caller's deadline."""

    status = Status.TIMEOUT


class CanceledError(ToolCallError):
    """``canceled``: the call was canceled before it finished."""

    status = Status.CANCELED


class ExpiredError(ToolCallError):
    """``expired``: the deadline had passed when a worker took the call; it did not run."""

    status = Status.EXPIRED


class CrashedError(ToolCallError):
    """``crashed``: the tool raised an unexpected exception or its worker died."""

    status = Status.CRASHED


class RejectedError(ToolCallError):
    """``rejected``: the request could not be decoded or was refused before running."""

    status = Status.REJECTED


ERROR_FOR_STATUS: dict[Status, type[ToolCallError]] = {
    cls.status: cls
    for cls in (
        ExtensionToolError,
        InvalidArgumentsError,
        UnknownFunctionError,
        NotAvailableError,
        ToolTimeoutError,
        CanceledError,
        ExpiredError,
        CrashedError,
        RejectedError,
    )
    if cls.status is not None
}
