"""What a call's cancel marker (``<ns>:cancel:<id>``) says, for the producer and the worker.

The producer writes the marker in two cases, and the worker must tell them apart:

- :data:`REQUESTED`: a client that does not hold the call (another web replica, a
  stateless gateway) asked to cancel it by its id. The caller still waits: the worker
  stops the call and posts ``canceled``.
- :data:`RESOLVED` (any other value, including the legacy ``b"1"``): the producer that made
  the call has resolved it itself (a local cancel, or its deadline passed). The worker
  stops or skips the call, records its outcome (``canceled``; past the deadline,
  ``timeout`` for a call it stops and ``expired`` for one it skips) and posts no reply:
  nobody reads it.
"""

from __future__ import annotations

__all__ = ["REQUESTED", "RESOLVED", "producer_resolved"]

#: Marker of a cancel asked for by id; the call's caller still waits for its reply.
REQUESTED = b"requested"
#: Marker of a call the producer resolved itself (canceled locally, or timed out).
RESOLVED = b"resolved"


def producer_resolved(marker: bytes | None) -> bool:
    """True when the marker says the producer resolved the call itself (no reply needed)."""
    return bool(marker) and marker != REQUESTED
