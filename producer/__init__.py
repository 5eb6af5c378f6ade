"""The producer library: hand tool calls to the fleet and get their results.

Imports only ``toolfleet.shared`` (never worker code or an extension).
"""

from toolfleet.producer.async_client import AsyncCallFuture, AsyncToolClient
from toolfleet.producer.client import CallFuture, ToolClient
from toolfleet.producer.events import CallEvent
from toolfleet.producer.stream import TurnStream

__all__ = [
    "AsyncCallFuture",
    "AsyncToolClient",
    "CallEvent",
    "CallFuture",
    "ToolClient",
    "TurnStream",
]
