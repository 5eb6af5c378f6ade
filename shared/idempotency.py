"""Idempotency keys: a second submission of the same call runs nothing and gets the first's outcome.

A caller that may submit one call twice (a web request retried by a load balancer, a
user's double submit) names it with an idempotency key. The enqueue script
(:mod:`toolfleet.shared.tenancy.enqueue`) checks the key's record
(:func:`toolfleet.shared.naming.idempotency_key`, per account) in the same atomic step
that publishes, so among any number of producer processes exactly one submission
publishes; the record is written only when the call is published (a call refused by a
quota or an open breaker leaves no record). It holds the first call's id and the
:func:`fingerprint` of what was called:

- same fingerprint: a duplicate (:class:`Duplicate`), answered with the first call's
  recorded outcome (``<ns>:outcome:<id>``), waiting for it while the call runs;
- another function or other arguments: misuse (:class:`Duplicate` with ``misuse``).

The record lives as long as the outcome it points to: until ``reply_ttl_s`` seconds
after the first call's deadline (:func:`record_ttl_ms`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import orjson

__all__ = [
    "FINGERPRINT_CHARS",
    "Duplicate",
    "Idempotency",
    "fingerprint",
    "misuse_message",
    "record_ttl_ms",
]

#: Characters of a fingerprint (a SHA-256 in hex); the record is the fingerprint, then the id.
FINGERPRINT_CHARS = 64


def fingerprint(function: str, arguments: dict[str, Any] | str | None) -> str:
    """A digest of what a call calls: its function and its arguments, canonically.

    Arguments given as the model's raw JSON string count as the value they parse to
    (``'{"a": 1}'`` and ``{"a": 1}`` are the same call); object keys are sorted, so their
    order does not matter. A string that is not JSON counts as that string.

    Returns:
        :data:`FINGERPRINT_CHARS` hex digits.
    """
    value: Any = arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except ValueError:
            value = {"raw": arguments}
    try:
        data = orjson.dumps([function, value], option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # big integers, lone surrogates
        data = json.dumps([function, value], sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(data).hexdigest()


def record_ttl_ms(deadline: float, now: float, reply_ttl_s: float) -> int:
    """Milliseconds a key's record lives: until ``reply_ttl_s`` after the call's deadline.

    As long as the worker keeps the call's outcome (its ``reply_ttl_s`` past the deadline).
    """
    return max(1, int((max(0.0, deadline - now) + reply_ttl_s) * 1000))


@dataclass(frozen=True, slots=True)
class Idempotency:
    """A call's idempotency key, ready for the enqueue script.

    Attributes:
        key: the caller's key, as given (for messages).
        record: the Redis key of its record (:func:`toolfleet.shared.naming.idempotency_key`).
        fingerprint: :func:`fingerprint` of the call.
    """

    key: str
    record: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Duplicate:
    """The enqueue script found the key's record: nothing was published.

    Attributes:
        call_id: the id of the call the key was first used for.
        misuse: the key was first used for another function or other arguments.
    """

    call_id: str
    misuse: bool


def misuse_message(key: str) -> str:
    """What a caller reads when ``key`` was first used for a different call."""
    return (
        f"idempotency key {key!r} was already used for a different call (another function "
        "or other arguments) within its lifetime; a new call needs a new key"
    )
