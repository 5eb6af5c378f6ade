"""The producer library: hand tool calls to the fleet and get their results.

Imports only ``toolfleet.shared`` (never worker code or an extension).
"""

from toolfleet.producer.async_client import AsyncToolClient
from toolfleet.producer.client import ToolClient

__all__ = ["AsyncToolClient", "ToolClient"]
