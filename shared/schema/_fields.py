"""Python field names for JSON property names.

A JSON Schema property can be named anything: ``X-RapidAPI-Key``, ``from``, ``2nd``,
``_id``, ``model_config``, ``json``. A pydantic field needs a Python identifier that is
not a keyword, does not start with ``_`` (pydantic makes those private) and does not
shadow a :class:`pydantic.BaseModel` attribute. Such a property gets a safe field name
and keeps its own name as the field's alias.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from typing import Final

from pydantic import BaseModel

__all__ = ["field_names"]

_RESERVED: Final = frozenset(dir(BaseModel))
_NOT_WORD: Final = re.compile(r"\W")


def _usable(name: str) -> bool:
    return (
        name.isidentifier()
        and not keyword.iskeyword(name)
        and not name.startswith("_")
        and name not in _RESERVED
    )


def _safe(name: str) -> str:
    base = _NOT_WORD.sub("_", name).strip("_") or "field"
    if base[0].isdigit():
        base = f"f_{base}"
    return base if _usable(base) else f"{base}_"


def field_names(properties: Iterable[str]) -> dict[str, str]:
    """Map each property name to a unique, usable Python field name.

    Names that are usable as they are keep themselves; the others get a cleaned name
    (``X-RapidAPI-Key`` → ``X_RapidAPI_Key``, ``from`` → ``from_``, ``json`` → ``json_``,
    ``_id`` → ``id``, ``2nd`` → ``f_2nd``), suffixed ``_2``, ``_3``, ... when taken.

    Args:
        properties: the property names, in schema order.

    Returns:
        ``{property name: field name}`` in the same order.
    """
    names = list(properties)
    taken = {name for name in names if _usable(name)}
    result: dict[str, str] = {}
    for name in names:
        if _usable(name):
            result[name] = name
            continue
        candidate = base = _safe(name)
        counter = 2
        while candidate in taken:
            candidate = f"{base}_{counter}"
            counter += 1
        taken.add(candidate)
        result[name] = candidate
    return result
