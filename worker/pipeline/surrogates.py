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

__all__ = ["REPLACEMENT", "has_lone_surrogate", "replace_lone_surrogates"]

REPLACEMENT = "\ufffd"
_SURROGATE = re.compile("[\ud800-\udfff]")


def has_lone_surrogate(text: str) -> bool:
    """True when ``text`` holds a lone surrogate (it does not encode as UTF-8)."""
    return not text.isascii() and _SURROGATE.search(text) is not None


def replace_lone_surrogates(value: Any) -> Any:
    """``value`` (a JSON value) with every lone surrogate in its strings and keys replaced.

    Returns the same object when nothing needed replacing.
    """
    if isinstance(value, str):
        if value.isascii() or _SURROGATE.search(value) is None:
            return value
        return _SURROGATE.sub(REPLACEMENT, value)
    if isinstance(value, dict):
        items = [(replace_lone_surrogates(k), replace_lone_surrogates(v)) for k, v in value.items()]
        if all(k is k0 and v is v0 for (k, v), (k0, v0) in zip(items, value.items(), strict=True)):
            return value
        return dict(items)
    if isinstance(value, list):
        replaced = [replace_lone_surrogates(item) for item in value]
        if all(a is b for a, b in zip(replaced, value, strict=True)):
            return value
        return replaced
    return value
