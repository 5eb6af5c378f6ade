"""The one rule that turns a function name into a Prometheus label value (worker and producer).

A call's ``function`` comes off the wire: any string a model, a client or a raw message
put there, of any length, lone surrogates included. As a label value it would open one
series per string (unbounded cardinality) and, holding a lone surrogate, make every
exposition fail to encode. So a metric never carries the wire string: it carries the
name of a function this side knows (the worker's registry, the catalog the producer
read), and every other string counts under :data:`UNKNOWN_FUNCTION_LABEL`.

The model that made a call (``context.llmclient``) is free text too: its label is the
name when the operator listed it (the ``quality_models`` setting,
``TOOLFLEET_QUALITY_MODELS``), else :data:`OTHER_MODEL_LABEL` (:func:`model_label`).
"""

from __future__ import annotations

import threading
from collections.abc import Container

from toolfleet.shared.naming import FUNCTION_NAME_RE, MAX_FUNCTION_NAME

__all__ = [
    "NO_MODEL_LABEL",
    "OTHER_MODEL_LABEL",
    "UNDECLARED_FIELD_LABEL",
    "UNKNOWN_FUNCTION_LABEL",
    "AskedNames",
    "field_label",
    "function_label",
    "model_label",
]

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


#: The ``model`` label of a call from a model not in the ``quality_models`` allow-list.
OTHER_MODEL_LABEL = "other"
#: The ``model`` label of a call whose context names no model (no ``llmclient``).
NO_MODEL_LABEL = "none"


def model_label(llmclient: object, allowed: Container[str]) -> str:
    """The ``model`` label of a call made by ``llmclient``, bounded by an allow-list.

    ``llmclient`` itself when it is in ``allowed`` (the ``quality_models`` setting),
    :data:`NO_MODEL_LABEL` when the call names no model (``None`` or ``""``), else
    :data:`OTHER_MODEL_LABEL`: the series a metric labelled with it can have are bounded
    by ``allowed`` plus two. O(1).

    Args:
        llmclient: the call's ``context.llmclient`` as it came.
        allowed: the model names to count by name (a frozenset, say).

    Returns:
        The label value.
    """
    if llmclient is None or llmclient == "":
        return NO_MODEL_LABEL
    if isinstance(llmclient, str) and llmclient in allowed:
        return llmclient
    return OTHER_MODEL_LABEL


#: The ``field`` label of an argument the tool does not declare (the model invented it).
UNDECLARED_FIELD_LABEL = "(undeclared)"


def field_label(path: str, declared: Container[str]) -> str:
    """The ``field`` label of a failing argument at ``path`` (e.g. ``items.*.qty``).

    The path's first part when the tool declares it (its arguments model's fields),
    ``(arguments)`` for the arguments as a whole, else :data:`UNDECLARED_FIELD_LABEL`:
    bounded by the tool's schema plus two, whatever names a model sends.

    Args:
        path: the failing field's dotted path.
        declared: the tool's top-level argument names.
    """
    head = path.split(".", 1)[0]
    if path == "(arguments)" or head in declared:
        return head
    return UNDECLARED_FIELD_LABEL


class AskedNames:
    """The ``asked`` label of calls to unknown functions: the name, for the first ``limit``.

    A model that invents function names could open a series per invention; this keeps
    the first ``limit`` distinct well-formed names (OpenAI's pattern, at most 64
    characters) this process saw and counts every later one, and every malformed one,
    under :data:`UNKNOWN_FUNCTION_LABEL`. Thread-safe, O(1).

    Args:
        limit: distinct names kept (100 by default).
    """

    def __init__(self, limit: int = 100) -> None:
        self.limit = limit
        self._kept: set[str] = set()
        self._lock = threading.Lock()

    def label(self, function: object) -> str:
        """The label value for a call to the unknown function ``function``."""
        if not (
            isinstance(function, str)
            and len(function) <= MAX_FUNCTION_NAME
            and FUNCTION_NAME_RE.fullmatch(function)
        ):
            return UNKNOWN_FUNCTION_LABEL
        with self._lock:
            if function in self._kept:
                return function
            if len(self._kept) < self.limit:
                self._kept.add(function)
                return function
        return UNKNOWN_FUNCTION_LABEL
