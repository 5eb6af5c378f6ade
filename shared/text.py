"""Redis replies as text: one rule for the bytes-or-str values redis-py returns.

A client made with ``decode_responses=False`` (toolfleet's default: bodies stay bytes)
returns ``bytes``; one made with ``decode_responses=True``, or a value that came from
Python, is already ``str``. Keys, hash fields and small values toolfleet writes are UTF-8.
"""

from __future__ import annotations

__all__ = ["as_text"]


def as_text(value: object) -> str:
    """``value`` as ``str``: ``bytes`` decoded as UTF-8, anything else through ``str()``.

    Raises:
        UnicodeDecodeError: ``bytes`` that are not UTF-8.
    """
    return value.decode() if isinstance(value, bytes) else str(value)
