"""Lifecycle signals of a tool call, as in-process hooks (blinker).

Subscribe from an extension or a host application::

    from toolfleet.shared.signals import tool_responded

    @tool_responded.connect
    def on_responded(sender: str, **event: object) -> None:
        print(event["function"], event["status"])

- ``tool_presented``: tools were exported to a model (producer, ``ToolClient.tools``);
  event keys ``functions``, ``account``, ``format``.
- ``tool_requested``: a worker accepted a call; keys ``id``, ``function``, ``account``,
  ``worker``, ``traceparent``, ``arguments`` (redacted unless the extension opts in).
- ``tool_responded``: a worker posted a call's reply; the keys above plus ``status``,
  ``queued_s``, ``run_s``, ``result`` (redacted unless opted in).

A producer fires ``tool_requested`` and ``tool_responded`` too, in the calling process,
with ``side="producer"`` (``toolfleet.producer.hooks``), also for a call it answers itself
without publishing (``unknown_function``, ``not_available``, ``rejected``).

The sender is the function name (or ``"toolfleet"``). The same events go to the Redis
stream ``<namespace>:events`` for dashboards (``toolfleet events``). Secret setting values
never appear in them.
"""

from __future__ import annotations

from blinker import Namespace

__all__ = ["REDACTED", "tool_presented", "tool_requested", "tool_responded"]

_signals = Namespace()

#: What stands in for arguments and results an event does not carry.
REDACTED = "[redacted]"

tool_presented = _signals.signal("tool_presented")
tool_requested = _signals.signal("tool_requested")
tool_responded = _signals.signal("tool_responded")
