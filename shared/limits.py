"""Bounds on a call that the producer and the worker both enforce, declared once here.

A budget must be a finite, positive number of seconds no larger than
:data:`MAX_TIMEOUT_S`. The producer refuses a larger one as misuse (``ClientError``); the
worker answers ``rejected`` to a raw message whose deadline lies further ahead (Redis
refuses expiry times that large, and nobody waits a week for a tool call).

Every other field of a request has a bound too, far above what a chat platform sends:
the wire models (:mod:`toolfleet.shared.wire`) declare them, so pydantic enforces them
when the producer builds a request (``ClientError`` naming the field and its bound) and
when a worker decodes one (``rejected``, answered briefly). Lengths are in characters
(``len(str)``), sizes in bytes of the encoded JSON, depth in nested arrays and objects
of the whole request document (``{"a": 1}`` is depth 1); ``arguments`` are bounded by the
``max_arguments_bytes`` setting.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "DEADLINE_SLACK_S",
    "MAX_DEPTH",
    "MAX_ID_CHARS",
    "MAX_METADATA_BYTES",
    "MAX_NAME_CHARS",
    "MAX_REPLY_TO_CHARS",
    "MAX_TIMEOUT_S",
    "MAX_TRACESTATE_CHARS",
    "deadline_problem",
    "timeout_problem",
]

#: The largest ``timeout_s`` a call may have, seconds (one day).
MAX_TIMEOUT_S = 86_400.0
#: Seconds a deadline may lie beyond ``now + MAX_TIMEOUT_S`` (clock skew between hosts).
DEADLINE_SLACK_S = 300.0

#: The deepest nesting of arrays and objects a JSON document on the wire may have: what
#: orjson's decoder accepts (it refuses a 1,025th level). The codec encodes and decodes
#: exactly the documents within it, whichever of orjson or the standard library does the
#: work, so a request the producer publishes is a request the worker can read.
MAX_DEPTH = 1024

#: Longest request ``id``, characters: the producer's are UUIDs (36); another producer's
#: prefixed or ULID ids fit too. It names Redis keys (claim, outcome, cancel marker).
MAX_ID_CHARS = 128
#: Longest ``tool_call_id``, ``function``, ``context.account``, ``user``, ``llmclient``,
#: ``conversation`` and ``traceparent``, characters. Model ids are ~30 (OpenAI
#: ``call_...``, Anthropic ``toolu_...``), catalog function names at most 64 (OpenAI's and
#: Anthropic's tool-name limit, :data:`toolfleet.shared.naming.MAX_FUNCTION_NAME`; a longer
#: name a model invents is still answered ``unknown_function``), an e-mail address at most
#: 254 (RFC 5321), a W3C ``traceparent`` 55.
MAX_NAME_CHARS = 256
#: Longest ``context.tracestate``, characters: the longest valid W3C ``tracestate``, 32
#: list members of a 256-character key, ``=`` and a 256-character value, comma-separated
#: (W3C Trace Context, section 3.3).
MAX_TRACESTATE_CHARS = 32 * (256 + 1 + 256) + 31
#: Longest ``reply_to``, characters: ``<namespace>:reply:<client id>`` (a Redis key).
MAX_REPLY_TO_CHARS = 1024
#: Largest ``context.metadata``, bytes of its JSON encoding (64 KiB: free-form tags, not a
#: payload; arguments carry data).
MAX_METADATA_BYTES = 65_536


def timeout_problem(timeout_s: Any) -> str:
    """Why ``timeout_s`` is not an acceptable budget ("" when it is).

    Acceptable: an ``int`` or ``float`` (not ``bool``), finite, ``> 0`` and
    ``<= MAX_TIMEOUT_S`` seconds.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)):
        return "timeout_s must be a positive, finite number of seconds"
    # compared before isfinite, which raises OverflowError for an int too large for a float
    if timeout_s > MAX_TIMEOUT_S:
        return f"timeout_s must be at most {MAX_TIMEOUT_S:g} seconds"
    if not timeout_s > 0 or not math.isfinite(timeout_s):
        return "timeout_s must be a positive, finite number of seconds"
    return ""


def deadline_problem(deadline: float, timeout_s: float, now: float) -> str:
    """Why a request's ``deadline`` and ``timeout_s`` cannot be served ("" when they can).

    Args:
        deadline: Unix epoch seconds.
        timeout_s: the caller's budget, seconds.
        now: the current Unix epoch time, seconds.

    A deadline in the past is servable (the call is answered ``expired``); one more than
    ``MAX_TIMEOUT_S + DEADLINE_SLACK_S`` seconds ahead, or not finite, is not.
    """
    if not math.isfinite(deadline):
        return "the deadline is not a finite number"
    if deadline - now > MAX_TIMEOUT_S + DEADLINE_SLACK_S:
        return f"the deadline is more than {MAX_TIMEOUT_S:g} seconds ahead"
    if not math.isfinite(timeout_s) or timeout_s < 0 or timeout_s > MAX_TIMEOUT_S:
        return f"timeout_s must be between 0 and {MAX_TIMEOUT_S:g} seconds"
    return ""
