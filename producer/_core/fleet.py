"""The Redis commands that tell the fleet about a call this client gives up on or cancels.

A call's cancel marker ``<ns>:cancel:<id>`` (:mod:`toolfleet.shared.cancels`) is read by
the worker's atomic outcome script before it posts a reply. The order matters: a call
this client resolves itself (a deadline passed, a local cancel) gets its ``RESOLVED``
marker written, in one transaction with a read of the call's recorded outcome,
*before* the caller's future is resolved. After that transaction either the worker had
recorded its outcome (its reply is already on the reply list: the caller gets that
result) or it never posts one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from toolfleet.shared.cancels import REQUESTED, RESOLVED
from toolfleet.shared.naming import cancel_channel, cancel_key, outcome_key

__all__ = ["outcomes_of", "queue_foreign_cancel", "queue_resolved"]

_PER_CALL = 3


def queue_resolved(pipe: Any, namespace: str, call_ids: Sequence[str], ttl_s: int) -> None:
    """Queue on ``pipe`` (a ``MULTI`` pipeline) the ``RESOLVED`` marker of each call.

    Per call: set the marker (``ttl_s`` seconds), read the recorded outcome, and publish
    the id on the cancel channel (a running tool stops). Sync and async pipelines alike;
    read the replies with :func:`outcomes_of`.
    """
    for call_id in call_ids:
        pipe.set(cancel_key(namespace, call_id), RESOLVED, ex=ttl_s)
        pipe.get(outcome_key(namespace, call_id))
        pipe.publish(cancel_channel(namespace), call_id)


def outcomes_of(replies: Sequence[Any]) -> list[bytes | None]:
    """Per call of :func:`queue_resolved`, its recorded outcome (a result envelope) or ``None``."""
    return [r if isinstance(r, bytes) else None for r in replies[1::_PER_CALL]]


def queue_foreign_cancel(pipe: Any, namespace: str, call_id: str, ttl_s: int) -> None:
    """Queue on ``pipe`` the cancel of a call this client does not hold (by its id).

    Three commands, whose results are ``(finished, marked, receivers)``: whether the call
    has its outcome, whether the ``REQUESTED`` cancel marker was set (only when no marker
    exists: a producer's ``RESOLVED`` marker stays), and the pub/sub message that reaches
    a running call. The cancel took effect when ``marked and not finished``. Works for
    sync and async pipelines alike.
    """
    pipe.exists(outcome_key(namespace, call_id))
    pipe.set(cancel_key(namespace, call_id), REQUESTED, ex=ttl_s, nx=True)
    pipe.publish(cancel_channel(namespace), call_id)
