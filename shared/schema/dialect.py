"""The BFCL schema dialect, turned into standard JSON Schema.

BFCL (Berkeley Function Calling Leaderboard) writes parameter schemas in a Python-ish
dialect; see ``shared/data/bfcl/FUNCTIONS.md``, section "BFCL schema dialect".
:func:`normalize_parameters` turns one into the JSON Schema (draft 2020-12) subset
that OpenAI's function calling accepts. The rules, one per quirk:

Types (``type``, matched case-insensitively; a list of types is mapped item by item):
    ``dict``/``HashMap``/``Hashtable`` → ``object``; ``float``/``double`` → ``number``;
    ``tuple``/``list``/``Array``/``ArrayList``/``Queue``/``Stack`` → ``array``;
    ``long``/``short``/``byte``/``Bigint`` → ``integer``; ``char``/``String`` → ``string``;
    ``Boolean`` → ``boolean``; ``integer``/``number``/``string``/``boolean``/``array``/
    ``object``/``null`` are kept. ``any``, the empty type ``""`` and any unknown type name
    mean **no type constraint**: the ``type`` key is dropped. (Upstream maps them to
    ``string``, which is lossy; narrow them only when exporting to a strict format.)

``optional`` (non-standard; ``true``, ``"True"``, ``"true"``, ``"yes"``, or a list of
names on an object):
    dropped. ``required`` decides: a name in ``required`` is required even when it says
    ``optional: true`` (irrelevance_173), and a name not in ``required`` is optional.

``required`` naming a property that ``properties`` lacks (parallel_29's nested
``population``: ``required: [adults, children, singles]`` and no ``properties``):
    each missing name is added as an unconstrained property ``{}``, so the requirement
    survives. An object that had no ``properties`` at all stays open: it gets
    ``additionalProperties: true`` unless it says otherwise. Duplicates are removed.

``dict`` with no ``properties`` (free-form):
    ``{"type": "object"}``, plus ``additionalProperties`` when given (rest's
    ``cookies``: ``{"type": "string"}``).

``default``:
    kept when it is valid for the declared type (and ``enum``). ``null`` and the string
    ``"None"`` are Python's ``None`` ("no value"), so they are dropped (an optional
    argument without default is ``None`` already) unless the type allows ``null``.
    A string that spells the declared scalar unambiguously is converted
    (``"false"`` → ``false`` for a boolean, ``"10"`` → ``10`` for an integer). Any other
    wrong-typed default (rest's ``verify: string`` with ``default: true``, ``array`` with
    ``default: "all"``) is dropped and kept as a hint: `` Default: <json>.`` is appended
    to the description unless it already mentions a default. Why drop: a default is what
    a tool receives for an omitted argument, and the string ``"false"`` is truthy.
    A ``default`` on a *required* parameter is kept as an annotation; ``required`` wins.

Other keys:
    ``description``, ``title``, ``enum``, ``const``, ``format`` (e.g. ``date``),
    ``minimum``/``maximum`` (and the exclusive ones), ``multipleOf``,
    ``minItems``/``maxItems``, ``minLength``/``maxLength``, ``pattern``, ``examples``
    are kept; ``items``, ``prefixItems``, ``properties``, ``additionalProperties``,
    ``anyOf``/``oneOf``/``allOf`` and ``$defs`` are normalized recursively; a list-valued
    ``items`` (old tuple form) becomes ``prefixItems``; OpenAPI's ``nullable: true``
    adds ``null`` to the types. Everything else is dropped.

Tolerated as they are (the schema imports; a call that disagrees is then rejected):
    ``array`` items declared at the wrong depth (exec_parallel_31 ``mat_mul``), a
    schema that disagrees with its own ground truth (exec_multiple_45 ``book_room``),
    and one function name declared with different parameters in different entries
    (``calculate_future_value``): definitions are per entry, never merged by name.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from toolfleet.shared.schema._loader import read_question_file
from toolfleet.shared.schema._names import FunctionNameMap, sanitize_function_name
from toolfleet.shared.schema.errors import SchemaError

__all__ = [
    "FunctionDefinition",
    "FunctionNameMap",
    "load_function_definitions",
    "normalize_parameters",
    "normalize_type",
    "sanitize_function_name",
    "TYPE_MAP",
]

#: Type names of the BFCL dialects (Python, Java, JavaScript), lower-cased, to JSON Schema.
TYPE_MAP: Final[Mapping[str, str]] = {
    "string": "string",
    "str": "string",
    "char": "string",
    "integer": "integer",
    "int": "integer",
    "long": "integer",
    "short": "integer",
    "byte": "integer",
    "bigint": "integer",
    "number": "number",
    "float": "number",
    "double": "number",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "tuple": "array",
    "list": "array",
    "arraylist": "array",
    "queue": "array",
    "stack": "array",
    "object": "object",
    "dict": "object",
    "hashmap": "object",
    "hashtable": "object",
    "null": "null",
}

_KEPT_AS_IS: Final = (
    "title",
    "const",
    "format",
    "pattern",
    "examples",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "uniqueItems",
    "$ref",
)
_SUBSCHEMA_LISTS: Final = ("anyOf", "oneOf", "allOf", "prefixItems")
_TRUE_WORDS: Final = frozenset({"true"})
_FALSE_WORDS: Final = frozenset({"false"})
_INTEGER_TEXT: Final = re.compile(r"^[+-]?\d+$")


def normalize_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """Turn a BFCL-dialect parameter schema into standard JSON Schema.

    The rules are in this module's docstring (source: ``FUNCTIONS.md``, "BFCL schema
    dialect"). A standard JSON Schema keeps its meaning (only keywords outside the kept
    set are dropped), normalizing a result again changes nothing, and the input is not
    modified.

    Args:
        parameters: a function's ``parameters``, e.g.
            ``{"type": "dict", "properties": {"n": {"type": "integer"}}, "required": ["n"]}``.
            An empty mapping means "no parameters".

    Returns:
        A JSON Schema object schema, always with ``type: "object"``, ``properties`` and
        ``required``, e.g.
        ``{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}``.

    Raises:
        SchemaError: the top level is not an object schema, or a part of it is not a
            schema at all (a property that is a string, a ``required`` that is not a list,
            ...); the message gives the path.
    """
    if not isinstance(parameters, Mapping):
        raise SchemaError(f"parameters: expected an object schema, got {_kind(parameters)}")
    schema = _normalize(parameters, "parameters")
    if "type" not in schema and not parameters:
        schema["type"] = "object"
    if schema.get("type") != "object":
        raise SchemaError(
            f"parameters: the top level must be an object schema (BFCL 'dict'), "
            f"got type {parameters.get('type')!r}"
        )
    schema.setdefault("properties", {})
    schema.setdefault("required", [])
    return schema


@dataclass(frozen=True, slots=True)
class FunctionDefinition:
    """One function definition of one BFCL entry, with its schema normalized.

    Definitions are per entry and never merged by name: BFCL declares the same name
    with different parameters in different entries (``calculate_future_value``).

    Attributes:
        entry_id: the entry's ``id``, e.g. ``"multiple_12"`` or ``"executable_simple_0"``.
        name: the declared name, e.g. ``"math.factorial"`` (the ground truth uses it).
        description: the declared description (``""`` when absent).
        parameters: the JSON Schema from :func:`normalize_parameters`.
        source_parameters: the ``parameters`` exactly as the file has them.
        line: the 1-based line of the entry in its file.
    """

    entry_id: str
    name: str
    description: str
    parameters: dict[str, Any]
    source_parameters: dict[str, Any]
    line: int

    @property
    def openai_name(self) -> str:
        """:func:`sanitize_function_name` of :attr:`name` (not unique; see FunctionNameMap)."""
        return sanitize_function_name(self.name)

    def to_openai_tool(self, name: str | None = None) -> dict[str, Any]:
        """The Chat Completions tool, ``{"type": "function", "function": {...}}``.

        Args:
            name: the name to publish, e.g. from a :class:`FunctionNameMap`; default
                :attr:`openai_name`.
        """
        return {
            "type": "function",
            "function": {
                "name": name or self.openai_name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def load_function_definitions(path: str | os.PathLike[str]) -> list[FunctionDefinition]:
    """Read every function definition of a BFCL question file and normalize it.

    Both layouts are read (``SOURCE.md``, "Format"): v3, where ``function`` is a list,
    and v1, where it is a single object in simple/parallel files.

    Args:
        path: a BFCL question file (JSON Lines), e.g. ``.../BFCL_v3_multiple.json``.

    Returns:
        The definitions in file order: 1,157 for simple + parallel + multiple.

    Raises:
        SchemaError: a line or a definition cannot be imported; the message says
            ``file:line``, the entry id and the function name.
        OSError: the file cannot be read.
    """
    definitions = []
    for line, entry_id, raw in read_question_file(path):
        where = f"{path}:{line} ({entry_id})"
        name = raw.get("name")
        if not isinstance(name, str) or not name:
            raise SchemaError(f"{where}: a function needs a non-empty 'name'")
        source = raw.get("parameters", {})
        try:
            parameters = normalize_parameters(source)
        except SchemaError as exc:
            raise SchemaError(f"{where} {name}: {exc}") from None
        description = raw.get("description", "")
        definitions.append(
            FunctionDefinition(
                entry_id=entry_id,
                name=name,
                description=description if isinstance(description, str) else str(description),
                parameters=parameters,
                source_parameters=source,
                line=line,
            )
        )
    return definitions


def normalize_type(name: object) -> str | None:
    """Map one BFCL type name to a JSON Schema type, or ``None`` for "no constraint".

    Args:
        name: a type name such as ``"dict"``, ``"float"``, ``"tuple"``, ``"String"``,
            ``"any"`` or ``""``.

    Returns:
        ``"object"``, ``"number"``, ``"array"``, ..., or ``None`` for ``any``, ``""``
        and names no BFCL dialect uses.

    Raises:
        SchemaError: ``name`` is not a string.
    """
    if not isinstance(name, str):
        raise SchemaError(f"a type name must be a string, got {_kind(name)}")
    return TYPE_MAP.get(name.strip().lower())


def _normalize(schema: Mapping[str, Any], path: str) -> dict[str, Any]:
    if not isinstance(schema, Mapping):
        raise SchemaError(f"{path}: expected a schema object, got {_kind(schema)}")
    out: dict[str, Any] = {}
    types = _types(schema, path)
    if types is not None:
        out["type"] = types[0] if len(types) == 1 else types
    description = schema.get("description")
    if description is not None:
        out["description"] = description if isinstance(description, str) else str(description)
    if "enum" in schema:
        out["enum"] = _enum(schema["enum"], path)
    for key in _KEPT_AS_IS:
        if key in schema:
            out[key] = schema[key]
    if "properties" in schema or "required" in schema:
        _object_keywords(schema, out, path)
    if "additionalProperties" in schema:
        out["additionalProperties"] = _additional(schema["additionalProperties"], path)
    _array_keywords(schema, out, path)
    for key in _SUBSCHEMA_LISTS:
        if key in schema and key != "prefixItems":
            out[key] = _schema_list(schema[key], f"{path}.{key}")
    if "$defs" in schema:
        out["$defs"] = _schema_map(schema["$defs"], f"{path}.$defs")
    if "default" in schema:
        _default(schema["default"], out)
    return out


def _types(schema: Mapping[str, Any], path: str) -> list[str] | None:
    """The JSON Schema types of ``schema``, or ``None`` for no constraint."""
    raw = schema.get("type")
    if raw is None:
        found = None if "properties" not in schema else ["object"]
    else:
        names = raw if isinstance(raw, list) else [raw]
        try:
            mapped = [normalize_type(name) for name in names]
        except SchemaError as exc:
            raise SchemaError(f"{path}.type: {exc}") from None
        known = [name for name in mapped if name is not None]
        found = list(dict.fromkeys(known)) if known and len(known) == len(mapped) else None
    if schema.get("nullable") is True and found is not None and "null" not in found:
        found.append("null")
    return found


def _enum(values: object, path: str) -> list[Any]:
    if not isinstance(values, list) or not values:
        raise SchemaError(f"{path}.enum: expected a non-empty list, got {_kind(values)}")
    unique: list[Any] = []
    for value in values:
        if not any(_same_json(value, seen) for seen in unique):
            unique.append(value)
    return unique


def _object_keywords(schema: Mapping[str, Any], out: dict[str, Any], path: str) -> None:
    declared = schema.get("properties")
    properties = {} if declared is None else _schema_map(declared, f"{path}.properties")
    required_raw = schema.get("required", [])
    if not isinstance(required_raw, list) or not all(isinstance(n, str) for n in required_raw):
        raise SchemaError(f"{path}.required: expected a list of names, got {required_raw!r}")
    required = list(dict.fromkeys(required_raw))
    missing = [name for name in required if name not in properties]
    properties.update({name: {} for name in missing})
    out["properties"] = properties
    out["required"] = required
    if missing and not declared and "additionalProperties" not in schema:
        out["additionalProperties"] = True


def _additional(value: object, path: str) -> bool | dict[str, Any]:
    if isinstance(value, bool):
        return value
    if isinstance(value, Mapping):
        return _normalize(value, f"{path}.additionalProperties")
    raise SchemaError(f"{path}.additionalProperties: expected a boolean or a schema")


def _array_keywords(schema: Mapping[str, Any], out: dict[str, Any], path: str) -> None:
    items = schema.get("items")
    if isinstance(items, list):
        out["prefixItems"] = _schema_list(items, f"{path}.items")
    elif isinstance(items, bool):
        out["items"] = items
    elif items is not None:
        out["items"] = _normalize(items, f"{path}.items")
    if "prefixItems" in schema:
        out["prefixItems"] = _schema_list(schema["prefixItems"], f"{path}.prefixItems")


def _schema_list(value: object, path: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise SchemaError(f"{path}: expected a list of schemas, got {_kind(value)}")
    return [_normalize(item, f"{path}[{i}]") for i, item in enumerate(value)]


def _schema_map(value: object, path: str) -> dict[str, dict[str, Any]]:
    if not isinstance(value, Mapping):
        raise SchemaError(f"{path}: expected an object of schemas, got {_kind(value)}")
    return {str(name): _normalize(sub, f"{path}.{name}") for name, sub in value.items()}


def _default(value: Any, out: dict[str, Any]) -> None:
    """Set ``out["default"]`` by the rules in the module docstring, or add a hint."""
    raw_types = out.get("type")
    types: list[str] | None = [raw_types] if isinstance(raw_types, str) else raw_types
    if (value is None or value == "None") and (types is None or "null" not in types):
        return
    if _fits(value, types, out.get("enum")):
        out["default"] = value
        return
    converted = _convert(value, types)
    if converted is not _NO_VALUE and _fits(converted, types, out.get("enum")):
        out["default"] = converted
        return
    description = out.get("description", "")
    if "default" not in description.lower():
        hint = f"Default: {json.dumps(value, ensure_ascii=False, default=str)}."
        out["description"] = f"{description.rstrip()} {hint}".lstrip()


_NO_VALUE: Final = object()


def _convert(value: Any, types: list[str] | None) -> Any:
    """A string that spells a value of the declared scalar type, as that value."""
    if not isinstance(value, str) or types is None:
        return _NO_VALUE
    text = value.strip()
    if "boolean" in types and text.lower() in _TRUE_WORDS | _FALSE_WORDS:
        return text.lower() in _TRUE_WORDS
    if ("integer" in types or "number" in types) and _INTEGER_TEXT.match(text):
        return int(text)
    if "number" in types:
        try:
            number = float(text)
        except ValueError:
            return _NO_VALUE
        return number if math.isfinite(number) else _NO_VALUE
    return _NO_VALUE


def _fits(value: Any, types: list[str] | None, enum: list[Any] | None) -> bool:
    """Whether ``value`` is valid for ``types`` (JSON Schema rules) and ``enum``."""
    if enum is not None and not any(_same_json(value, option) for option in enum):
        return False
    return types is None or any(_is_json_type(value, t) for t in types)


def _is_json_type(value: Any, json_type: str) -> bool:
    if json_type == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer()
        )
    if json_type == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    checks: dict[str, type | tuple[type, ...]] = {
        "string": str,
        "boolean": bool,
        "array": (list, tuple),
        "object": Mapping,
        "null": type(None),
    }
    expected = checks.get(json_type)
    return expected is not None and isinstance(value, expected)


def _same_json(a: Any, b: Any) -> bool:
    """JSON equality: ``1 == 1.0`` but ``True != 1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__
