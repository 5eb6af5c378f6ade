"""Code common to producer and worker: wire models, codec, tool protocol, naming, settings."""

from toolfleet.shared.errors import (
    BackpressureError,
    CanceledError,
    ClientClosedError,
    ClientError,
    ConfigurationError,
    CrashedError,
    ExpiredError,
    ExtensionToolError,
    IdempotencyKeyError,
    InvalidArgumentsError,
    NotAvailableError,
    RejectedError,
    ToolCallError,
    ToolfleetError,
    ToolTimeoutError,
    UnknownFunctionError,
)
from toolfleet.shared.extension import Extension
from toolfleet.shared.settings import Settings
from toolfleet.shared.status import Status
from toolfleet.shared.tool import ExtensionContext, Tool
from toolfleet.shared.wire import CallContext, ToolCallRequest, ToolCallResult

__all__ = [
    # tool protocol
    "Extension",
    "ExtensionContext",
    "Tool",
    # wire
    "CallContext",
    "Status",
    "ToolCallRequest",
    "ToolCallResult",
    "Settings",
    # errors
    "BackpressureError",
    "CanceledError",
    "ClientClosedError",
    "ClientError",
    "ConfigurationError",
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
