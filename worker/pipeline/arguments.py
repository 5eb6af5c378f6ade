"""Parse and validate a call's arguments (the model's JSON string or an object).

Policy (each case gives one terminal reply, never a worker traceback):

- ``None`` or ``""`` count as ``{}``; so do ``"null"``/``null`` for a tool without parameters.
- A string is parsed as JSON; a parse error (truncated JSON, a trailing comma, anything
  but whitespace after the value) is ``invalid_arguments`` saying where parsing stopped.
  Nothing is "repaired".
- A JSON string that itself holds a JSON object (double encoding) is unwrapped once.
- Anything but an object is ``invalid_arguments``: "arguments must be a JSON object".
- An argument the tool does not declare is ``invalid_arguments``: "unexpected argument: x"
  (the same rule as the strict export's ``additionalProperties: false``).
- Values are validated with the tool's pydantic model in lax mode (``"20"`` is accepted
  for an integer); a failure names each argument and why ("p: field required").
- ``null`` for an optional argument whose type refuses ``None`` counts as left out
  (OpenAI strict mode sends it for "use the default"; the rule is
  :func:`toolfleet.shared.nulls.drop_default_nulls`).
- A top-level array or object sent as a JSON string where the schema wants one is
  decoded and validated again.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any

from pydantic import BaseModel, ValidationError

from toolfleet.shared import codec
from toolfleet.shared.errors import InvalidArgumentsError
from toolfleet.shared.nulls import drop_default_nulls
from toolfleet.worker.pipeline.surrogates import replace_lone_surrogates

__all__ = ["parse_arguments"]

_CONTAINER_ERRORS = {
    "list_type",
    "dict_type",
    "model_type",
    "tuple_type",
    "set_type",
    "model_attributes_type",
}


def parse_arguments(raw: dict[str, Any] | str | None, model: type[BaseModel]) -> BaseModel:
    """Turn raw tool-call arguments into a validated instance of ``model``.

    Args:
        raw: the request's ``arguments``: an object, the model's JSON text, or ``None``.
        model: the tool's pydantic arguments model.

    Returns:
        The validated model instance.

    Raises:
        InvalidArgumentsError: with a short message the model can act on.
    """
    value = replace_lone_surrogates(_decode(raw, has_fields=bool(model.model_fields)))
    _reject_extra(value, model)
    value = drop_default_nulls(value, model)
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        retried = _decode_nested_strings(value, exc)
        if retried is not None:
            try:
                return model.model_validate(retried)
            except ValidationError as again:
                exc = again
        raise InvalidArgumentsError(_describe(exc), problems=_problems(exc)) from None


def _decode(raw: dict[str, Any] | str | None, *, has_fields: bool) -> dict[str, Any]:
    value: Any = raw
    if isinstance(raw, str):
        if not raw.strip():
            return {}
        try:
            value = codec.loads(raw)
        except codec.DecodeError as exc:
            raise InvalidArgumentsError(
                f"arguments are not valid JSON: {exc}", problems=(("(arguments)", "not_json"),)
            ) from None
        if isinstance(value, str):  # double-encoded: a JSON string holding the object
            with contextlib.suppress(codec.DecodeError):
                value = codec.loads(value)
    if value is None and (raw is None or not has_fields):
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentsError(
            f"arguments must be a JSON object, got {_json_type(value)}",
            problems=(("(arguments)", "not_object"),),
        )
    return value


#: model -> (its fields mapping, the argument names it accepts), read once per model
_KNOWN: weakref.WeakKeyDictionary[type[BaseModel], tuple[dict[str, Any], frozenset[str]]] = (
    weakref.WeakKeyDictionary()
)


def _known_names(model: type[BaseModel]) -> frozenset[str]:
    """Field names and string aliases of ``model`` (again when its fields were rebuilt)."""
    fields = model.model_fields
    cached = _KNOWN.get(model)
    if cached is not None and cached[0] is fields:
        return cached[1]
    known: set[str] = set()
    for name, info in fields.items():
        known.add(name)
        if isinstance(info.alias, str):
            known.add(info.alias)
        if isinstance(info.validation_alias, str):
            known.add(info.validation_alias)
    _KNOWN[model] = (fields, frozenset(known))
    return frozenset(known)


def _reject_extra(value: dict[str, Any], model: type[BaseModel]) -> None:
    if model.model_config.get("extra") == "allow":
        return
    known = _known_names(model)
    extra = [key for key in value if key not in known]
    if extra:
        label = "unexpected argument" if len(extra) == 1 else "unexpected arguments"
        names = sorted(map(str, extra))
        raise InvalidArgumentsError(
            f"{label}: {', '.join(names)}", problems=tuple((name, "extra") for name in names)
        )


def _decode_nested_strings(value: dict[str, Any], exc: ValidationError) -> dict[str, Any] | None:
    changed = dict(value)
    fixed = False
    for error in exc.errors():
        loc = error.get("loc", ())
        if len(loc) != 1 or error.get("type") not in _CONTAINER_ERRORS:
            continue
        key = loc[0]
        if not isinstance(key, str):
            continue
        text = value.get(key)
        if not isinstance(text, str):
            continue
        try:
            decoded = codec.loads(text)
        except codec.DecodeError:
            continue
        if isinstance(decoded, (list, dict)):
            changed[key] = decoded
            fixed = True
    return changed if fixed else None


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
        message = str(error.get("msg", "invalid"))
        if error.get("type") == "missing":
            message = "field required"
        parts.append(f"{where}: {message[:1].lower()}{message[1:]}")
    return "; ".join(parts[:10])


#: pydantic error types that mean "not one of the allowed values".
_ENUM_ERRORS = {"enum", "literal_error"}


def _problems(exc: ValidationError) -> tuple[tuple[str, str], ...]:
    """``(field, reason)`` of each error: the path with list positions as ``*``."""
    found: dict[tuple[str, str], None] = {}
    for error in exc.errors(include_url=False, include_input=False):
        loc = error.get("loc", ())
        where = ".".join("*" if isinstance(p, int) else str(p) for p in loc) or "(arguments)"
        found[(where, _reason(str(error.get("type", ""))))] = None
    return tuple(found)


def _reason(kind: str) -> str:
    if kind == "missing":
        return "missing"
    if kind in _ENUM_ERRORS:
        return "enum"
    if kind == "extra_forbidden":
        return "extra"
    if kind.endswith(("_type", "_parsing")) or kind in {"int_from_float", "is_instance_of"}:
        return "wrong_type"
    return "invalid"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return type(value).__name__
