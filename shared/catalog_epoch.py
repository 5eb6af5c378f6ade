"""Catalog epochs: "being republished after Redis lost its data" is not "no such function".

Redis may lose every key (a restart without persistence, a failover to an empty
replica). Workers then republish the catalog one heartbeat at a time, so for up to one
heartbeat interval a producer can read a catalog that holds some functions and not
others. A function missing from it may exist; answering ``unknown_function`` would tell
the model it does not. A fresh fleet, whose first catalog is just as young, must still
answer a genuinely unknown name ``unknown_function`` at once.

The signal:

- ``<ns>:catalog:epoch`` holds an epoch id. Each heartbeat runs :data:`REPUBLISH_SCRIPT`:
  the first worker to find the key missing writes a new id and opens the *recovery
  window*, the set ``<ns>:catalog:recovering`` (holding :data:`WINDOW_MARK`), which
  expires after one worker TTL: by then every live worker has republished.
- Every worker remembers the function names of the catalog of its epoch. A worker that
  finds a new epoch while the window is open adds the names it remembers to the set:
  those functions were served before the loss. A fresh fleet's workers remember
  nothing, so its window holds no names.
- A producer that reads a catalog without a function answers ``not_available``
  (retryable) while the window is open and the function is in the set or among the
  functions that producer process has itself seen in the catalog of this namespace;
  otherwise ``unknown_function``. Once the window has closed, a function still missing
  (its worker really left) is ``unknown_function``.
"""

from __future__ import annotations

from collections.abc import Iterable

from toolfleet.shared import scripts
from toolfleet.shared.text import as_text

__all__ = ["REPUBLISH_SCRIPT", "WINDOW_MARK", "recovering_functions"]

#: The member that marks the recovery window open (not a function name: those never
#: contain ``*``).
WINDOW_MARK = "*"

#: The source of ``republish.lua`` (KEYS: epoch key, recovering key; ARGV: a fresh epoch
#: id, the window in milliseconds, the epoch this worker knows, the function names it
#: remembers from that epoch, one per line). Returns the current epoch.
REPUBLISH_SCRIPT = scripts.source("republish", WINDOW_MARK=WINDOW_MARK)


def recovering_functions(members: Iterable[bytes | str]) -> frozenset[str] | None:
    """The functions served before Redis lost its data, or ``None`` outside a recovery window.

    Args:
        members: ``SMEMBERS`` of ``<ns>:catalog:recovering`` as read.
    """
    names = {as_text(m) for m in members}
    if WINDOW_MARK not in names:
        return None
    return frozenset(names - {WINDOW_MARK})
