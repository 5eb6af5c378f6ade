"""What ``null`` means for an optional argument: "use its default", for every tool style.

OpenAI strict mode makes every property required, so :mod:`toolfleet.shared.export` turns
an optional property whose schema refuses ``null`` into ``anyOf [<schema>, null]``, and a
model then sends ``null`` where it means "leave it out". One rule, applied wherever
arguments are validated (the worker's argument parser for class tools, and the models
:func:`toolfleet.shared.schema.model_from_schema` builds for metadata, ``deftool`` and
delegate tools): such a ``null`` is removed before validation, so the argument counts as
*not sent* — the tool sees its default (a class tool's field default; a keyword
handler's own default, because unset arguments are not passed).

A ``null`` for an argument whose type accepts ``None`` (``str | None = "x"``) is a value
and is kept; a ``null`` for a required argument is kept and fails validation.
"""

from __future__ import annotations

import types
import weakref
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

__all__ = ["accepts_none", "drop_default_nulls"]

_UNIONS = (Union, types.UnionType)


def drop_default_nulls(value: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """Remove ``null`` for optional arguments of ``model`` whose type refuses ``None``.

    Applied at every level of nested models (fields holding a model, or a list of them).

    Args:
        value: the decoded arguments object (not changed).
        model: the pydantic model they are validated with.

    Returns:
        A new dict without those ``null`` s.
    """
    out = dict(value)
    for name, alias, drops_null, nested in _fields_of(model):
        key = alias if alias is not None and alias in out else name
        if key not in out:
            continue
        item = out[key]
        if item is None and drops_null:
            del out[key]
            continue
        if nested is not None and isinstance(item, dict):
            out[key] = drop_default_nulls(item, nested)
        elif nested is not None and isinstance(item, list):
            out[key] = [drop_default_nulls(x, nested) if isinstance(x, dict) else x for x in item]
    return out


#: Per field of a model: (name, its alias when a string, whether a ``null`` for it is
#: dropped, the model it holds or ``None``); read from the model's fields once.
_Fields = tuple[tuple[str, str | None, bool, type[BaseModel] | None], ...]
_FIELDS: weakref.WeakKeyDictionary[type[BaseModel], tuple[dict[str, Any], _Fields]] = (
    weakref.WeakKeyDictionary()
)


def _fields_of(model: type[BaseModel]) -> _Fields:
    """What :func:`drop_default_nulls` reads of ``model``'s fields, kept per model.

    Worked out again when the model's fields mapping is another object (a model rebuilt).
    """
    fields = model.model_fields
    cached = _FIELDS.get(model)
    if cached is not None and cached[0] is fields:
        return cached[1]
    plan = tuple(
        (
            name,
            info.alias if isinstance(info.alias, str) else None,
            not info.is_required() and not accepts_none(info.annotation),
            _model_in(info.annotation),
        )
        for name, info in fields.items()
    )
    _FIELDS[model] = (fields, plan)
    return plan


def accepts_none(annotation: Any) -> bool:
    """Whether a field annotation accepts ``None`` (read from its structure)."""
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Annotated:
        return accepts_none(get_args(annotation)[0])
    if origin in (*_UNIONS, Literal):
        return any(arg is None or accepts_none(arg) for arg in get_args(annotation))
    return False


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None
