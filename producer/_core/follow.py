"""Calls answered with another call's outcome: a second submission under one idempotency key.

The enqueue script publishes nothing for a duplicate (:mod:`toolfleet.shared.idempotency`)
and names the call the key was first used for. Its outcome is recorded by whoever
answers that call (``<ns>:outcome:<id>``, the worker's or the watchdog's), so any
producer process can read it, also when the first caller is gone. :class:`Following`
holds the duplicates waiting for it; a shell's poller reads their outcome keys (one
``MGET`` per poll, only while some wait) and hands what it read to :meth:`settle`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from pydantic import ValidationError

from toolfleet.shared import codec
from toolfleet.shared.naming import outcome_key
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, ToolCallResult

__all__ = ["POLL_S", "Following", "replayed"]

#: Seconds between two reads of the outcomes duplicates wait for.
POLL_S = 0.05


def replayed(request: ToolCallRequest, first: ToolCallResult) -> ToolCallResult:
    """``first``'s outcome as the answer to ``request``: its own ids, ``duplicate_of`` set."""
    return first.model_copy(
        update={
            "id": request.id,
            "tool_call_id": request.tool_call_id,
            "function": request.function,
            "duplicate_of": first.id,
        }
    )


class Following:
    """The duplicates of one client waiting for the outcome of their first call (thread-safe).

    Args:
        namespace: the key prefix.
    """

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self._lock = threading.Lock()
        self._waiting: dict[str, tuple[ToolCallRequest, str]] = {}

    def add(self, request: ToolCallRequest, first_id: str, prefix: str | None = None) -> None:
        """Wait for the outcome of call ``first_id`` to answer ``request``.

        ``prefix``: the key prefix of the first call's keys (its group's on a cluster: the
        idempotency record's); ``None``: :attr:`namespace`.
        """
        outcome = outcome_key(prefix or self.namespace, first_id)
        with self._lock:
            self._waiting[request.id] = (request, outcome)

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)

    def keys(self) -> tuple[list[str], list[str]]:
        """``(ids of the waiting duplicates, the outcome keys they wait for)``, in one order."""
        with self._lock:
            items = list(self._waiting.items())
        return [own for own, _ in items], [key for _, (_, key) in items]

    def settle(
        self, ids: Sequence[str], raws: Sequence[bytes | None], holds: set[str]
    ) -> list[ToolCallResult]:
        """The answers of the duplicates whose first call has its outcome now.

        Args:
            ids: as :meth:`keys` returned them.
            raws: per id, what its outcome key held (a result envelope) or ``None``.
            holds: the ids the client still waits for (any other, e.g. resolved at its
                deadline, is forgotten).

        Returns:
            One result per duplicate answered (and forgotten).
        """
        answers: list[ToolCallResult] = []
        with self._lock:
            for own, raw in zip(ids, raws, strict=True):
                entry = self._waiting.get(own)
                if entry is None:
                    continue
                if own not in holds:
                    del self._waiting[own]
                    continue
                first = _result(raw)
                if first is not None:
                    del self._waiting[own]
                    answers.append(replayed(entry[0], first))
        return answers


def _result(raw: bytes | None) -> ToolCallResult | None:
    if raw is None:
        return None
    try:
        return ReplyEnvelope.decode(raw).result
    except (codec.DecodeError, ValidationError):
        return None
