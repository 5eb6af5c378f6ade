"""Read a request's top-level string members from JSON text that does not decode.

A request nested deeper than the codec accepts (:data:`~toolfleet.shared.limits.MAX_DEPTH`)
is refused whole, yet its reply address is usually readable: this scan walks the text's
strings and brackets (a regular expression, no recursion, any depth) and keeps the string
values of the outermost object's members, so the request can still be answered
``rejected``. Members nested inside ``arguments`` or ``context`` are never taken for the
request's own.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection

__all__ = ["top_level_strings"]

#: A JSON string (escapes included) or one of the structural characters.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:,]', re.DOTALL)


def top_level_strings(data: str | bytes, names: Collection[str]) -> dict[str, str]:
    """The string values of the members ``names`` of the outermost JSON object in ``data``.

    Args:
        data: JSON text (UTF-8 bytes or text), possibly invalid or too deep to decode.
        names: the member names wanted, e.g. ``{"reply_to", "id"}``.

    Returns:
        Member name -> its value, for each wanted member whose value is a string (the
        last one when a name repeats, as a decoder keeps). Empty when ``data`` is not an
        object.
    """
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    found: dict[str, str] = {}
    depth = 0
    key: str | None = None
    state = "key"  # at depth 1: "key" -> "colon" -> "value" -> "next"
    for match in _TOKEN.finditer(text):
        token = match.group()
        first = token[0]
        if first in "{[":
            if depth == 0 and first != "{":
                return {}
            depth += 1
            if depth == 2:
                state = "next"  # a container value: not a string
            continue
        if first in "}]":
            depth -= 1
            if depth <= 0:
                break
            continue
        if depth != 1:
            continue
        if first == ":":
            state = "value" if state == "colon" else "next"
        elif first == ",":
            key, state = None, "key"
        elif state == "key":
            key, state = _string(token), "colon"
        elif state == "value":
            value = _string(token) if key in names else None
            if key is not None and value is not None:
                found[key] = value
            state = "next"
    return found


def _string(token: str) -> str | None:
    try:
        value = json.loads(token)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
