"""Build a pydantic v2 model from a JSON Schema object, to validate tool-call arguments.

The worker validates the arguments of a tool defined by JSON Schema (a BFCL function, a
``deftool(name, description, parameters)``) with the model :func:`model_from_schema`
builds. Validation is pydantic's default lax mode (``"20"`` is accepted for an
integer, ``5.0`` for an integer, ``"true"`` for a boolean; a number is *not* accepted
for a string), and a :class:`pydantic.ValidationError` names the argument by its JSON
name in each error's ``loc`` (``("params", "lat")``).

Schema → Python (the subset OpenAI function calling uses, draft 2020-12):

=======================================  ===============================================
``string`` / ``integer`` / ``number``     ``str`` / ``int`` / ``int | float`` (a JSON
                                          integer stays an exact ``int``), with
                                          ``minLength``, ``maxLength``, ``pattern``,
                                          ``minimum``, ``maximum``, ``exclusive*``,
                                          ``multipleOf`` as constraints
``boolean`` / ``null``                    ``bool`` / ``None``
``array``                                 ``list[<items>]`` (``minItems``/``maxItems``);
                                          ``prefixItems`` → ``tuple[...]``
``object`` with ``properties``            a nested model, built by the same rules
``object`` without ``properties``         ``dict[str, <additionalProperties> or Any]``
no ``type`` (BFCL ``any``)                ``Any``
``enum`` / ``const``                      ``Literal[...]``; for an integer, number or
                                          boolean enum the input is coerced first, so
                                          ``"2"`` matches ``2``
a list of types, ``anyOf``, ``oneOf``     a union; ``null`` in it makes the field nullable
``$ref`` (``#/$defs/...``), ``allOf``     resolved; one ``allOf`` member only; no
of one schema                             recursive references
=======================================  ===============================================

Field rules:

- A required property has no default. An optional one defaults to the schema's
  ``default``, else ``None``, and also accepts an explicit ``null``: a ``null`` for an
  optional property whose schema does not allow ``null`` means "not sent", so it is not
  in ``model_fields_set`` and ``model_dump(exclude_unset=True)`` leaves it out (OpenAI
  strict mode makes models send ``null`` for arguments they leave out; the rule is
  :func:`toolfleet.shared.nulls.drop_default_nulls`).
- Unknown arguments are rejected (``extra="forbid"``), in nested objects too, unless the
  object's schema opens itself with ``additionalProperties: true`` or a schema (then
  extra keys are kept, unvalidated).
- A property name that is not a usable Python field name (``X-RapidAPI-Key``, ``from``,
  ``_id``, ``model_config``, ``schema``, ``json``, ``copy``) gets a safe field name and
  its JSON name as alias; input is read by alias only, and ``model_dump()`` writes the
  JSON names back (``serialize_by_alias``).
- Descriptions become field descriptions; the schema's description becomes the docstring.
"""

from __future__ import annotations

import functools
import operator
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.fields import FieldInfo

from toolfleet.shared.nulls import drop_default_nulls
from toolfleet.shared.schema._fields import field_names
from toolfleet.shared.schema.errors import SchemaError

__all__ = ["model_from_schema"]

_SCALARS: dict[str, Any] = {"string": str, "integer": int, "number": float, "boolean": bool}
_CONSTRAINTS: dict[str, dict[str, str]] = {
    "string": {"minLength": "min_length", "maxLength": "max_length", "pattern": "pattern"},
    "integer": {
        "minimum": "ge",
        "maximum": "le",
        "exclusiveMinimum": "gt",
        "exclusiveMaximum": "lt",
        "multipleOf": "multiple_of",
    },
    "array": {"minItems": "min_length", "maxItems": "max_length"},
}
_CONSTRAINTS["number"] = _CONSTRAINTS["integer"]
_NOT_WORD = re.compile(r"\W+")


def model_from_schema(schema: Mapping[str, Any], name: str) -> type[BaseModel]:
    """Build a pydantic model that validates the arguments ``schema`` describes.

    The rules are in this module's docstring. Pass standard JSON Schema: convert a BFCL
    schema with :func:`toolfleet.shared.schema.dialect.normalize_parameters` first.

    Args:
        schema: a JSON Schema object schema, e.g.
            ``{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}``.
        name: the model's class name, e.g. the function name; nested models are named
            ``<name>_<property>``.

    Returns:
        A model class with ``extra="forbid"`` (unless the schema opens itself); its
        ``model_validate(arguments)`` raises :class:`pydantic.ValidationError` naming
        each bad argument by its JSON name.

    Raises:
        SchemaError: the schema is not an object schema, uses a type name JSON Schema
            does not have (``dict``, ``float``: normalize it first), a ``$ref`` that does
            not resolve or recurses, or ``allOf`` with several members.
    """
    if not isinstance(schema, Mapping):
        raise SchemaError(f"{name}: expected an object schema, got {type(schema).__name__}")
    kind = schema.get("type", "object")
    if kind != "object":
        raise SchemaError(f"{name}: the arguments schema must have type 'object', got {kind!r}")
    return _Builder(schema).model(schema, name)


class _Builder:
    """Builds annotations and nested models; keeps the root for ``$ref`` look-ups."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        self._root = root
        self._resolving: list[str] = []

    def model(self, schema: Mapping[str, Any], name: str) -> type[BaseModel]:
        properties = schema.get("properties") or {}
        required = schema.get("required") or []
        if not isinstance(properties, Mapping):
            raise SchemaError(f"{name}.properties: expected an object of schemas")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{name}.required: expected a list of names")
        properties = {**properties, **{r: {} for r in required if r not in properties}}
        fields: dict[str, Any] = {}
        for prop, field_name in field_names(properties).items():
            sub = properties[prop]
            hint = f"{name}_{_NOT_WORD.sub('_', prop)}"
            fields[field_name] = self._field(prop, field_name, sub, prop in required, hint)
        description = schema.get("description")
        return create_model(
            name,
            __config__=_config(schema),
            __doc__=description if isinstance(description, str) else None,
            __validators__={"null_means_default": _NULL_MEANS_DEFAULT},
            **fields,
        )

    def _field(
        self, prop: str, field_name: str, sub: Any, required: bool, hint: str
    ) -> tuple[Any, FieldInfo]:
        """The annotation and FieldInfo of one property.

        An optional property keeps its schema's type (``None`` is its default only when
        the schema has none): a ``null`` sent for it is dropped before validation by
        :func:`toolfleet.shared.nulls.drop_default_nulls`, so it counts as not sent.
        """
        annotation = self.annotation(sub, hint)
        info: dict[str, Any] = {}
        if field_name != prop:
            info["alias"] = prop
        if isinstance(sub, Mapping) and isinstance(sub.get("description"), str):
            info["description"] = sub["description"]
        if required:
            return annotation, Field(..., **info)
        default = sub.get("default") if isinstance(sub, Mapping) else None
        return annotation, Field(default, **info)

    def annotation(self, schema: object, hint: str) -> Any:
        if schema is True or schema == {}:
            return Any
        if not isinstance(schema, Mapping):
            raise SchemaError(f"{hint}: expected a schema, got {schema!r}")
        if "$ref" in schema:
            return self._ref(schema["$ref"], hint)
        if "allOf" in schema:
            return self.annotation(_merge_all_of(schema, hint), hint)
        if "enum" in schema or "const" in schema:
            return _enum(schema, hint)
        options = schema.get("anyOf", schema.get("oneOf"))
        if options is not None:
            if not isinstance(options, list) or not options:
                raise SchemaError(f"{hint}: anyOf/oneOf must be a non-empty list")
            return _union([self.annotation(o, f"{hint}_{i}") for i, o in enumerate(options)])
        kind = schema.get("type")
        if kind is None:
            return self._object(schema, hint) if "properties" in schema else Any
        kinds = kind if isinstance(kind, list) else [kind]
        return _union([self._typed(schema, k, hint) for k in kinds])

    def _typed(self, schema: Mapping[str, Any], kind: object, hint: str) -> Any:
        if kind == "null":
            return None
        if kind == "object":
            return self._object(schema, hint)
        if kind == "array":
            return _constrained(self._array(schema, hint), schema, "array")
        if kind == "number":  # a JSON integer stays an exact int (103, not 103.0)
            return _constrained(int | float, schema, kind)
        if isinstance(kind, str) and kind in _SCALARS:
            return _constrained(_SCALARS[kind], schema, kind)
        raise SchemaError(
            f"{hint}: unknown type {kind!r} (a BFCL schema? use normalize_parameters first)"
        )

    def _array(self, schema: Mapping[str, Any], hint: str) -> Any:
        prefix = schema.get("prefixItems")
        if isinstance(prefix, list) and prefix:
            parts = tuple(self.annotation(p, f"{hint}_{i}") for i, p in enumerate(prefix))
            return tuple.__class_getitem__(parts)
        items = schema.get("items")
        item = Any if items is None else self.annotation(items, f"{hint}_item")
        return list[item]  # type: ignore[valid-type]

    def _object(self, schema: Mapping[str, Any], hint: str) -> Any:
        extra = schema.get("additionalProperties")
        if "properties" not in schema and extra is not False:
            value = Any if extra in (None, True) else self.annotation(extra, f"{hint}_value")
            return dict[str, value]  # type: ignore[valid-type]
        return self.model(schema, hint)

    def _ref(self, ref: object, hint: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"{hint}: only local references ('#/$defs/...') are supported")
        if ref in self._resolving:
            raise SchemaError(f"{hint}: recursive reference {ref} is not supported")
        target: Any = self._root
        for part in filter(None, ref[1:].split("/")):
            key = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or key not in target:
                raise SchemaError(f"{hint}: reference {ref} does not resolve")
            target = target[key]
        self._resolving.append(ref)
        try:
            return self.annotation(target, hint)
        finally:
            self._resolving.pop()


def _config(schema: Mapping[str, Any]) -> ConfigDict:
    extra = schema.get("additionalProperties")
    return ConfigDict(
        extra="allow" if extra is True or isinstance(extra, Mapping) else "forbid",
        protected_namespaces=(),
        validate_by_alias=True,
        validate_by_name=False,
        serialize_by_alias=True,
    )


def _drop_default_nulls(cls: type[BaseModel], data: Any) -> Any:
    """Before validation: ``null`` for an optional property that refuses it means "not sent"."""
    return drop_default_nulls(data, cls) if isinstance(data, dict) else data


_NULL_MEANS_DEFAULT: Any = model_validator(mode="before")(_drop_default_nulls)


def _merge_all_of(schema: Mapping[str, Any], hint: str) -> dict[str, Any]:
    members = schema["allOf"]
    if not isinstance(members, list) or len(members) != 1 or not isinstance(members[0], Mapping):
        raise SchemaError(f"{hint}: allOf is supported with exactly one schema")
    merged = {k: v for k, v in schema.items() if k != "allOf"}
    return {**merged, **members[0]}


def _enum(schema: Mapping[str, Any], hint: str) -> Any:
    values = [schema["const"]] if "const" in schema else schema["enum"]
    if not isinstance(values, list) or not values:
        raise SchemaError(f"{hint}: enum must be a non-empty list")
    try:
        hash(tuple(values))
    except TypeError:  # an unhashable value (a list or an object): check membership
        return Annotated[Any, AfterValidator(functools.partial(_member, values=values))]
    literal: Any = Literal.__getitem__(tuple(values))
    kinds = schema.get("type")
    base = _SCALARS.get(kinds) if isinstance(kinds, str) and kinds != "string" else None
    if base is None:
        return literal
    return Annotated[literal, BeforeValidator(functools.partial(_coerce, TypeAdapter(base)))]


def _member(value: Any, values: list[Any]) -> Any:
    if value not in values:
        raise ValueError(f"Input should be one of {values!r}")
    return value


def _coerce(adapter: TypeAdapter[Any], value: Any) -> Any:
    """Lax-convert ``value`` to the enum's declared type; leave it as is when that fails."""
    try:
        return adapter.validate_python(value)
    except ValidationError:
        return value


def _constrained(base: Any, schema: Mapping[str, Any], kind: str) -> Any:
    names = _CONSTRAINTS.get(kind, {})
    constraints = {py: schema[js] for js, py in names.items() if js in schema}
    return Annotated[base, Field(**constraints)] if constraints else base


def _union(parts: list[Any]) -> Any:
    unique: list[Any] = []
    for part in parts:
        if part is Any:
            return Any
        if not any(part is seen or part == seen for seen in unique):
            unique.append(part)
    return functools.reduce(operator.or_, unique)
