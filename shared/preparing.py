"""The ``preparing`` stage: what a UI shows while the model is still writing a call.

A streaming caller assembles a tool call's arguments from deltas; before the call can be
made, it can show the tool's *preparation description* (multi-llm-ts's
``getPreparationDescription``). Workers publish each tool's text in the catalog
(``preparation``; a tool declares it as ``preparation_description`` — a string, or a
method given the tool's name — or ``getPreparationDescription(tool)``). The text may name
arguments in braces, ``"Looking up the weather in {city}…"``: the producer fills them
from the partial arguments received so far (:func:`preparation_text`), and a name not
there yet reads ``…``. One rule here, so every producer renders it the same way.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Any

from toolfleet.shared import codec

__all__ = ["partial_arguments", "preparation_text"]

#: Longest partial-argument text looked at, characters (a preview needs no more).
MAX_PARTIAL_CHARS = 20_000
_CLOSERS = {"{": "}", "[": "]"}
_PENDING = "…"


def partial_arguments(partial: str | Mapping[str, Any] | None) -> dict[str, Any]:
    """The arguments an incomplete JSON object already holds.

    ``'{"city": "Par'`` gives ``{"city": "Par"}``; a key without its value yet is left
    out; anything that is not (the start of) an object gives ``{}``. Never raises.

    Args:
        partial: the argument text streamed so far, or an object.

    Returns:
        The complete members, with the last string cut where the text ends.
    """
    if partial is None:
        return {}
    if isinstance(partial, Mapping):
        return dict(partial)
    text = partial[:MAX_PARTIAL_CHARS].strip()
    if not text.startswith("{"):
        return {}
    for end in range(len(text), 0, -1):
        value = _close(text[:end])
        if value is not None:
            return value
        if len(text) - end > 64:  # only the tail can be incomplete
            break
    return {}


def preparation_text(template: str | None, partial: str | Mapping[str, Any] | None) -> str | None:
    """Fill a preparation description's ``{argument}`` placeholders from partial arguments.

    Args:
        template: the catalog's ``preparation`` text, or ``None``.
        partial: the argument text streamed so far (or an object).

    Returns:
        The text, with each placeholder replaced by the argument's value (strings as
        they are, other values as JSON) or ``…`` while it is not there yet; a text whose
        braces are not placeholders is returned as it is; ``None`` without a template.
    """
    if not template:
        return None
    values = partial_arguments(partial)
    out: list[str] = []
    try:
        for literal, field, _spec, _conversion in string.Formatter().parse(template):
            out.append(literal)
            if field is not None:
                out.append(_shown(values.get(field, _PENDING)) if field else "{}")
    except ValueError:  # unbalanced braces: not a template
        return template
    return "".join(out)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return codec.dumps_str(value)
    except codec.EncodeError:
        return _PENDING


def _close(prefix: str) -> dict[str, Any] | None:
    """``prefix`` completed with the quotes and brackets it leaves open, if that parses."""
    stack: list[str] = []
    in_string = escaped = False
    for char in prefix:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in _CLOSERS:
            stack.append(_CLOSERS[char])
        elif char in "}]" and stack:
            stack.pop()
    if escaped:
        return None
    text = prefix + ('"' if in_string else "") + "".join(reversed(stack))
    try:
        value = codec.loads(text)
    except codec.DecodeError:
        return None
    return value if isinstance(value, dict) else None
