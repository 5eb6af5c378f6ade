"""The one rule that turns a function name into a Prometheus label value (worker and producer).

A call's ``function`` comes off the wire: any string a model, a client or a raw message
put there, of any length, lone surrogates included. As a label value it would open one
series per string (unbounded cardinality) and, holding a lone surrogate, make every
exposition fail to encode. So a metric never carries the wire string: it carries the
name of a function this side knows (the worker's registry, the catalog the producer
read), and every other string counts under :data:`UNKNOWN_FUNCTION_LABEL`.
"""

from __future__ import annotations

from collections.abc import Container

from toolfleet.shared.naming import FUNCTION_NAME_RE, MAX_FUNCTION_NAME

__all__ = ["UNKNOWN_FUNCTION_LABEL", "function_label"]

#: The label value of every function name this side does not know. Served function names
#: are ``ext_<slug>_<tool>`` (:func:`toolfleet.shared.naming.function_name`), so no served
#: function is ever counted under it by mistake.
UNKNOWN_FUNCTION_LABEL = "unknown"


def function_label(function: object, known: Container[str]) -> str:
    """The ``function`` label value of a call to ``function``.

    ``function`` itself when it is in ``known`` and a well-formed function name
    (OpenAI's ``^[a-zA-Z0-9_-]{1,64}$``, :data:`toolfleet.shared.naming.FUNCTION_NAME_RE`),
    else :data:`UNKNOWN_FUNCTION_LABEL`. The result is ASCII (so valid UTF-8) and at most
    :data:`~toolfleet.shared.naming.MAX_FUNCTION_NAME` (64) characters; the series a
    metric labelled with it can have are bounded by ``known`` plus one. O(1): the length
    is checked before anything reads the string.

    Args:
        function: the call's function as it came (any object off the wire).
        known: the functions this side knows: the worker's served functions, the
            producer's catalog snapshot (any container of names: a dict, a set).

    Returns:
        The label value.
    """
    if (
        isinstance(function, str)
        and len(function) <= MAX_FUNCTION_NAME
        and function in known
        and FUNCTION_NAME_RE.fullmatch(function)
    ):
        return function
    return UNKNOWN_FUNCTION_LABEL
