r"""Lone surrogates become U+FFFD, so that what reaches a tool or a caller always encodes.

A JSON text may carry ``"\\ud800"`` (an escape of half a UTF-16 pair); Python decodes it
to a one-character string that no UTF-8 encoder accepts. Passed on to a tool, or returned
in ``result.content``, it breaks the caller's own ``json.dumps``/``orjson.dumps``. The
worker replaces each lone surrogate with U+FFFD (the Unicode replacement character), in
arguments before validation and in results before they are posted. A name that must stay
as sent (a reply address, a call id: parts of Redis key names) is not replaced but
refused: :func:`has_lone_surrogate` tells.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

__all__ = ["REPLACEMENT", "has_lone_surrogate", "replace_lone_surrogates"]

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` holds a lone surrogate (it does not encode as UTF-8)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def replace_lone_surrogates(value: Any) -> Any:
    """``value`` (a JSON value) with every lone surrogate in its strings and keys replaced.

    Returns the same object when nothing needed replacing, else a copy of its arrays and
    objects. Walks without recursion, so a value nested as deep as a request may be
    (:data:`~toolfleet.shared.limits.MAX_DEPTH`) is handled like a flat one.
    """
    if isinstance(value, str):
        return _replaced(value)
    if not isinstance(value, (dict, list)):
        return value
    try:
        orjson.dumps(value)  # refuses a lone surrogate in any string or key (C speed)
    except (orjson.JSONEncodeError, TypeError):
        pass  # that, or something else it does not encode as it stands: looked at below
    else:
        return value
    if not _holds_lone_surrogate(value):
        return value
    copy = _shell(value)
    stack: list[tuple[Any, Any]] = [(value, copy)]
    while stack:
        source, target = stack.pop()
        pairs = source.items() if isinstance(source, dict) else enumerate(source)
        for key, item in pairs:
            new = _shell(item)
            if isinstance(target, dict):
                target[_replaced(key) if isinstance(key, str) else key] = new
            else:
                target.append(new)
            if isinstance(item, (dict, list)):
                stack.append((item, new))
    return copy


def _replaced(text: str) -> str:
    if text.isascii() or _SURROGATE.search(text) is None:
        return text
    return _SURROGATE.sub(REPLACEMENT, text)


def _shell(item: Any) -> Any:
    """An empty container of ``item``'s kind (filled later), a string's replacement, or ``item``."""
    if isinstance(item, dict):
        return {}
    if isinstance(item, list):
        return []
    if isinstance(item, str):
        return _replaced(item)
    return item


def _holds_lone_surrogate(value: dict[Any, Any] | list[Any]) -> bool:
    stack: list[Any] = [value]
    while stack:
        container = stack.pop()
        items = container
        if isinstance(container, dict):
            if any(isinstance(k, str) and has_lone_surrogate(k) for k in container):
                return True
            items = container.values()
        for item in items:
            if isinstance(item, str):
                if has_lone_surrogate(item):
                    return True
            elif isinstance(item, (dict, list)):
                stack.append(item)
    return False
