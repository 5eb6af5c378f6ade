"""Tool lists in the shapes model APIs take, built from catalog entries.

A catalog entry is a JSON object with ``name``, ``description`` and ``parameters`` (a
JSON Schema object, as pydantic's ``model_json_schema()`` writes it) and, optionally,
``display_name`` and ``display_description`` (text for people, not for the model).
:func:`export_tools` renders a list of them in one of :data:`FORMATS`:

==================  ==================================================================
``openai``          ``{"type": "function", "function": {"name", "description",
                    "parameters"}}`` — OpenAI Chat Completions API reference, ``tools``.
``openai-strict``   the same plus ``"strict": true`` and a strict schema
                    (:func:`to_strict_schema`) — OpenAI function calling guide, strict mode,
                    and the Structured Outputs guide, "Supported schemas".
``responses``       ``{"type": "function", "name", "description", "parameters",
                    "strict"}`` — OpenAI Responses API reference, function tools (flat, no
                    ``function`` wrapper). Strict like ``openai-strict``, as the openai
                    package's ``pydantic_responses_function_tool`` builds it.
``anthropic``       ``{"name", "description", "input_schema"}`` — Anthropic Messages API,
                    tool use ("Specifying client tools").
``mcp``             ``{"name", "title"?, "description", "inputSchema", "annotations"?,
                    "outputSchema"?}`` — Model Context Protocol specification, server
                    features, tools (``Tool``; ``title`` is the human-readable name, taken
                    from ``display_name``; ``annotations`` are the entry's MCP hints plus
                    ``idempotentHint`` for an idempotent tool; ``outputSchema`` is the
                    entry's ``output_schema``).
``display``         for user interfaces, not for a model: ``{"name", "display_name",
                    "description", "display_description", "preparation", "parameters":
                    [{"name", "type", "description", "display_description",
                    "required"}]}`` (``display_*`` fall back to ``name`` /
                    ``description``; RAGFlow's ``displayName`` / ``displayDescription``;
                    ``type`` is the JSON type with ``null`` left out, so an optional
                    ``str | None`` parameter reads ``"string"``).
==================  ==================================================================

Strict schemas follow what the official ``openai`` Python package does in
``openai.lib._pydantic.to_strict_json_schema`` (used by ``openai.pydantic_function_tool``):
every object gets ``additionalProperties: false`` unless it sets it; every property is
listed in ``required``; ``default: null`` is dropped; a single-entry ``allOf`` is merged
into its parent; a ``$ref`` with sibling keywords is replaced by the definition it points
to (siblings win) while a bare ``$ref`` and ``$defs`` stay; other keywords (``title``,
``format``, ``minimum``, ...) are left as they are. It differs on purpose in three ways:

1. A property that was optional (absent from its object's ``required``) and does not
   already accept ``null`` becomes nullable — ``{"anyOf": [<schema>, {"type": "null"}]}``
   with ``title``/``description``/``default`` kept outside — as the Structured Outputs
   guide says to emulate optional fields. The openai package makes such a property
   required *and* non-nullable, so the model must always invent a value and can never
   ask for the default. Consequence for the receiving side: ``null`` for a field that
   has a default means "use the default".
2. A ``$ref`` with siblings that points back into a definition being inlined (a
   recursive model) becomes ``{"anyOf": [{"$ref": ...}], <siblings>}`` instead of being
   inlined forever (the openai package recurses without end).
3. The input is never changed (the openai package mutates the schema it is given).
4. Keywords strict mode does not accept are moved into the property's description, which
   the model still reads: ``default`` (``"Page size. Default: 20."``; the model sends
   ``null`` to get it, see :mod:`toolfleet.shared.nulls`), ``minLength`` and
   ``maxLength`` (``"At most 4000 characters."``). The worker validates arguments
   against the original schema, so the bounds still hold.

A schema strict mode would still reject (an open map such as ``dict[str, int]``,
``oneOf``, ``patternProperties``, a value of any type; see :func:`strict_problems`) is
exported with ``"strict": false`` and its original schema, for that tool only, so one
tool cannot make the API refuse a whole request; the reason is logged (logger
``toolfleet.export``, once per tool and reason).
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["FORMATS", "SCHEMA_HASH_KEY", "export_tools", "strict_problems", "to_strict_schema"]

#: The metadata key holding the schema hash a model is shown (MCP ``_meta``, and the
#: ``metadata`` object of the other formats when asked for): pass it back as a call's
#: ``schema_hash`` to pin the call to that schema.
SCHEMA_HASH_KEY = "toolfleet/schema_hash"

#: Every format :func:`export_tools` renders.
FORMATS = ("openai", "openai-strict", "responses", "anthropic", "mcp", "display")

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}
#: Annotations kept beside ``anyOf`` when a property is made nullable (pydantic's shape).
_ANNOTATIONS = ("title", "description", "default", "examples")
_DEFS_KEYS = ("$defs", "definitions")
_STRICT_UNSUPPORTED = ("oneOf", "patternProperties")
#: Keywords strict mode refuses that become words of the description instead.
_TO_DESCRIPTION = {
    "minLength": "At least {} characters.",
    "maxLength": "At most {} characters.",
    "default": "Default: {}.",
}
#: Keywords that give a schema a type (a schema with none of them accepts any value).
_TYPING = ("type", "anyOf", "allOf", "oneOf", "$ref", "enum", "const", "not")

log = logging.getLogger("toolfleet.export")
_logged: set[tuple[str, tuple[str, ...]]] = set()


def export_tools(
    entries: Iterable[Mapping[str, Any]], fmt: str = "openai", *, metadata: bool = False
) -> list[dict[str, Any]]:
    """Render catalog entries as the tool list of one model API.

    An entry's ``schema_hash`` goes into MCP's ``_meta`` (``toolfleet/schema_hash``), a
    field the MCP specification gives to implementations. The model APIs refuse fields
    they do not define, so the other formats carry it only with ``metadata``, as
    ``"metadata": {"toolfleet/schema_hash": ...}`` beside the tool's own fields, for the
    caller to read and strip before sending the list.

    Args:
        entries: catalog entries: ``name``, ``description`` and ``parameters`` (JSON
            Schema object; ``{"type": "object", "properties": {}}`` when absent), optional
            ``display_name`` (becomes MCP's ``title``), ``display_description`` and
            ``display_parameters`` (for people: only the ``display`` format shows them,
            no format sends them to a model).
        fmt: one of :data:`FORMATS` (shapes and sources in the module docstring).
        metadata: add each tool's ``metadata`` object (formats other than ``mcp``).

    Returns:
        One JSON object per entry, in order. Nothing in it is shared with ``entries``,
        which are left unchanged.

    Raises:
        ValueError: unknown format, or an entry without a string ``name``.
    """
    render = _RENDERERS.get(fmt)
    if render is None:
        raise ValueError(f"unknown tool format {fmt!r}; expected one of {', '.join(FORMATS)}")
    tools = []
    for entry in entries:
        tool = render(entry)
        pin = entry.get("schema_hash")
        if pin and fmt == "mcp":
            tool["_meta"] = {SCHEMA_HASH_KEY: str(pin)}
        elif pin and metadata and fmt != "display":
            tool["metadata"] = {SCHEMA_HASH_KEY: str(pin)}
        tools.append(tool)
    return tools


def to_strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite a JSON Schema for OpenAI strict mode (function calling, Structured Outputs).

    See the module docstring for the rules and how they differ from the openai
    package's ``to_strict_json_schema``. The result may still hold constructs strict
    mode rejects; :func:`strict_problems` lists them.

    Args:
        schema: a JSON Schema object; it is not changed.

    Returns:
        A new schema.

    Raises:
        ValueError: a ``$ref`` that is not local (``#/...``) or points nowhere.
    """
    return _Strictifier(schema).node(copy.deepcopy(dict(schema)))


def strict_problems(schema: Mapping[str, Any]) -> list[str]:
    """Reasons OpenAI strict mode would reject ``schema``, as ``"<path>: <why>"``.

    Checks what pydantic models commonly produce, not all of JSON Schema: the root must
    be an object; every object must have ``additionalProperties: false`` and list every
    property in ``required``; ``oneOf`` and ``patternProperties`` are not supported; a
    property of any type (no ``type``, ``anyOf``, ``$ref``, ``enum`` ...) is not
    supported; neither are ``default``, ``minLength`` and ``maxLength`` (Structured
    Outputs guide, "Supported schemas").

    Args:
        schema: a schema, usually the output of :func:`to_strict_schema`.

    Returns:
        The problems found; empty when none.
    """
    found: list[str] = []
    if schema.get("type") != "object":
        found.append("#: the root must be an object schema")
    _collect_problems(schema, "#", found)
    return found


def _collect_problems(node: Any, path: str, found: list[str]) -> None:
    if not isinstance(node, Mapping):
        return
    for keyword in (*_STRICT_UNSUPPORTED, *_TO_DESCRIPTION):
        if keyword in node:
            found.append(f"{path}: {keyword} is not supported")
    properties = node.get("properties")
    if isinstance(properties, Mapping):
        for name, sub in properties.items():
            if sub is True or (isinstance(sub, Mapping) and not _typed(sub)):
                found.append(f"{path}/properties/{name}: a value of any type is not supported")
    if node.get("type") == "object" or isinstance(properties, Mapping):
        if node.get("additionalProperties", True) is not False:
            found.append(f"{path}: additionalProperties must be false (open objects are not)")
        if isinstance(properties, Mapping) and set(node.get("required", ())) != set(properties):
            found.append(f"{path}: every property must be required")
    for child_path, child in _children(node, path):
        _collect_problems(child, child_path, found)


def _typed(schema: Mapping[str, Any]) -> bool:
    return any(k in schema for k in _TYPING) or "properties" in schema


def _children(node: Mapping[str, Any], path: str) -> Iterable[tuple[str, Any]]:
    for keyword in ("properties", *_DEFS_KEYS):
        named = node.get(keyword)
        if isinstance(named, Mapping):
            yield from ((f"{path}/{keyword}/{k}", v) for k, v in named.items())
    for keyword in ("items", "additionalProperties"):
        if isinstance(node.get(keyword), Mapping):
            yield f"{path}/{keyword}", node[keyword]
    for keyword in ("anyOf", "allOf", "oneOf", "prefixItems"):
        listed = node.get(keyword)
        if isinstance(listed, list):
            yield from ((f"{path}/{keyword}/{i}", v) for i, v in enumerate(listed))


class _Strictifier:
    """One :func:`to_strict_schema` run.

    ``node`` rewrites, in place, a private copy of the schema; ``$ref``s resolve against
    the untouched original, so an inlined definition is a fresh copy rewritten in its turn.
    """

    def __init__(self, original: Mapping[str, Any]) -> None:
        self.original = original
        self.inlining: list[str] = []  # the $refs being inlined, outermost first

    def node(self, schema: dict[str, Any]) -> dict[str, Any]:
        for keyword in _DEFS_KEYS:
            defs = schema.get(keyword)
            if isinstance(defs, dict):
                schema[keyword] = {name: self.node(sub) for name, sub in defs.items()}
        if schema.get("type") == "object":
            schema.setdefault("additionalProperties", False)
        if isinstance(schema.get("properties"), dict):
            self._properties(schema)
        if isinstance(schema.get("items"), dict):
            schema["items"] = self.node(schema["items"])
        if isinstance(schema.get("anyOf"), list):
            schema["anyOf"] = [self.node(variant) for variant in schema["anyOf"]]
        self._all_of(schema)
        if "default" in schema and schema["default"] is None:
            del schema["default"]  # null is the default anyway once the field is nullable
        if "$ref" in schema and len(schema) > 1:
            return self._inline(schema)
        _describe_refused(schema)
        return schema

    def _properties(self, schema: dict[str, Any]) -> None:
        properties: dict[str, Any] = schema["properties"]
        required = set(schema.get("required", ()))
        strict: dict[str, Any] = {}
        for name, sub in properties.items():
            done = self.node(sub)
            if name not in required and not self._admits_null(done, ()):
                done = _nullable(done)
            strict[name] = done
        schema["properties"] = strict
        schema["required"] = list(strict)

    def _all_of(self, schema: dict[str, Any]) -> None:
        all_of = schema.get("allOf")
        if not isinstance(all_of, list):
            return
        if len(all_of) == 1:
            del schema["allOf"]
            schema.update(self.node(all_of[0]))
        else:
            schema["allOf"] = [self.node(entry) for entry in all_of]

    def _inline(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema["$ref"]
        siblings = {key: value for key, value in schema.items() if key != "$ref"}
        if ref in self.inlining:  # recursive: keep the reference, keep the annotations
            return {"anyOf": [{"$ref": ref}], **siblings}
        merged = {**copy.deepcopy(dict(self._resolve(ref))), **siblings}
        self.inlining.append(ref)
        try:
            return self.node(merged)
        finally:
            self.inlining.pop()

    def _resolve(self, ref: str) -> Mapping[str, Any]:
        if not ref.startswith("#/"):
            raise ValueError(f"$ref {ref!r} is not local (#/...)")
        target: Any = self.original
        for token in ref[2:].split("/"):
            key = token.replace("~1", "/").replace("~0", "~")
            if not isinstance(target, Mapping) or key not in target:
                raise ValueError(f"$ref {ref!r} points nowhere")
            target = target[key]
        if not isinstance(target, Mapping):
            raise ValueError(f"$ref {ref!r} does not point to a schema object")
        return target

    def _admits_null(self, schema: Any, seen: tuple[str, ...]) -> bool:
        if not isinstance(schema, Mapping):
            return schema is True
        declared = schema.get("type", "null")
        if "null" not in (declared if isinstance(declared, list) else [declared]):
            return False
        if "enum" in schema and None not in schema["enum"]:
            return False
        if "const" in schema and schema["const"] is not None:
            return False
        for keyword, combine in (("anyOf", any), ("oneOf", any), ("allOf", all)):
            if isinstance(schema.get(keyword), list):
                return combine(self._admits_null(sub, seen) for sub in schema[keyword])
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref not in seen:
            return self._admits_null(self._resolve(ref), (*seen, ref))
        return True


def _describe_refused(schema: dict[str, Any]) -> None:
    """Move ``default``, ``minLength`` and ``maxLength`` into the description."""
    words = [
        template.format(json.dumps(schema.pop(key), ensure_ascii=False, default=str))
        for key, template in _TO_DESCRIPTION.items()
        if key in schema
    ]
    if not words:
        return
    description = schema.get("description")
    text = description.rstrip() if isinstance(description, str) else ""
    if text and text[-1] not in ".!?":
        text += "."
    schema["description"] = " ".join([text, *words] if text else words)


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kept = {key: schema[key] for key in _ANNOTATIONS if key in schema}
    inner = {key: value for key, value in schema.items() if key not in kept}
    variants = inner["anyOf"] if list(inner) == ["anyOf"] else [inner]
    return {"anyOf": [*variants, {"type": "null"}], **kept}


def _name(entry: Mapping[str, Any]) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"catalog entry without a name: {dict(entry)!r:.200}")
    return name


def _description(entry: Mapping[str, Any]) -> str:
    return str(entry.get("description") or "")


def _parameters(entry: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy(dict(entry.get("parameters") or _EMPTY_PARAMETERS))


def _strict_parameters(entry: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The strict schema and ``True``, or the schema as given and ``False`` (logged)."""
    plain = _parameters(entry)
    try:
        strict = to_strict_schema(plain)
    except ValueError as exc:
        problems = [f"#: {exc}"]
    else:
        problems = strict_problems(strict)
        if not problems:
            return strict, True
    _log_not_strict(_name(entry), problems)
    return plain, False


def _log_not_strict(name: str, problems: list[str]) -> None:
    key = (name, tuple(problems))
    if key in _logged:
        return
    if len(_logged) > 10_000:  # a bound on memory, not a policy
        _logged.clear()
    _logged.add(key)
    log.warning("%s is exported with strict false: %s", name, "; ".join(problems))


def _openai(entry: Mapping[str, Any]) -> dict[str, Any]:
    function = {
        "name": _name(entry),
        "description": _description(entry),
        "parameters": _parameters(entry),
    }
    return {"type": "function", "function": function}


def _openai_strict(entry: Mapping[str, Any]) -> dict[str, Any]:
    parameters, strict = _strict_parameters(entry)
    function = {
        "name": _name(entry),
        "description": _description(entry),
        "parameters": parameters,
        "strict": strict,
    }
    return {"type": "function", "function": function}


def _responses(entry: Mapping[str, Any]) -> dict[str, Any]:
    parameters, strict = _strict_parameters(entry)
    return {
        "type": "function",
        "name": _name(entry),
        "description": _description(entry),
        "parameters": parameters,
        "strict": strict,
    }


def _anthropic(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": _name(entry),
        "description": _description(entry),
        "input_schema": _parameters(entry),
    }


def _mcp(entry: Mapping[str, Any]) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": _name(entry)}
    if entry.get("display_name"):
        tool["title"] = str(entry["display_name"])
    tool["description"] = _description(entry)
    tool["inputSchema"] = _parameters(entry)
    annotations = _mcp_annotations(entry)
    if annotations:
        tool["annotations"] = annotations
    if isinstance(entry.get("output_schema"), Mapping):
        tool["outputSchema"] = copy.deepcopy(dict(entry["output_schema"]))
    return tool


def _display(entry: Mapping[str, Any]) -> dict[str, Any]:
    schema = _parameters(entry)
    properties = schema.get("properties")
    required = set(schema.get("required") or ())
    shown = entry.get("display_parameters") or {}
    parameters = [
        {
            "name": name,
            "type": _display_type(sub, schema),
            "description": str(sub.get("description") or "") if isinstance(sub, Mapping) else "",
            "display_description": str(
                shown.get(name)
                or (sub.get("description") if isinstance(sub, Mapping) else "")
                or ""
            ),
            "required": name in required,
        }
        for name, sub in (properties.items() if isinstance(properties, Mapping) else ())
    ]
    return {
        "name": _name(entry),
        "display_name": str(entry.get("display_name") or _name(entry)),
        "description": _description(entry),
        "display_description": str(entry.get("display_description") or _description(entry)),
        "preparation": entry.get("preparation"),
        "parameters": parameters,
    }


def _display_type(schema: Any, root: Mapping[str, Any] | None = None) -> str | None:
    """The JSON type a person is shown for a parameter's ``schema``, ``null`` left out.

    An optional parameter's schema often only says its type inside a union with
    ``null`` (pydantic writes ``str | None`` as ``{"anyOf": [{"type": "string"},
    {"type": "null"}]}``; others write ``{"type": ["string", "null"]}``): its type is
    the non-null part. ``oneOf`` reads like ``anyOf``; ``allOf`` takes the first typed
    member; a ``$ref`` (local, ``#/...``) is followed into ``root``; ``enum`` and
    ``const`` without a ``type`` give their values' JSON type.

    Args:
        schema: a property's JSON Schema (a mapping; ``True`` or anything else: any type).
        root: the schema the ``$ref`` s point into (the tool's parameters).

    Returns:
        A JSON Schema type name (``"string"``, ``"integer"``, ``"array"`` ...), several
        joined by ``" | "`` for a union, ``"null"`` when null is all it accepts, or
        ``None`` when it accepts a value of any type.
    """
    names = _type_names(schema, root or {}, ())
    if names is None:
        return None
    shown = [name for name in names if name != "null"] or names
    return " | ".join(shown) if shown else None


def _type_names(schema: Any, root: Mapping[str, Any], seen: tuple[str, ...]) -> list[str] | None:
    """The type names ``schema`` accepts, in order, or ``None`` for any type."""
    if not isinstance(schema, Mapping):
        return None
    declared = schema.get("type")
    if isinstance(declared, str):
        return [declared]
    if isinstance(declared, list) and declared:
        return _unique(str(name) for name in declared)
    for keyword in ("anyOf", "oneOf"):
        variants = schema.get(keyword)
        if isinstance(variants, list) and variants:
            found: list[str] = []
            for variant in variants:
                names = _type_names(variant, root, seen)
                if names is None:
                    return None
                found += names
            return _unique(found)
    all_of = schema.get("allOf")
    if isinstance(all_of, list):
        for member in all_of:
            names = _type_names(member, root, seen)
            if names is not None:
                return names
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/") and ref not in seen:
        target: Any = root
        for token in ref[2:].split("/"):
            key = token.replace("~1", "/").replace("~0", "~")
            target = target.get(key) if isinstance(target, Mapping) else None
        return _type_names(target, root, (*seen, ref))
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return _unique(_json_type(value) for value in schema["enum"])
    if "const" in schema:
        return [_json_type(schema["const"])]
    if "properties" in schema:
        return ["object"]
    return None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _unique(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(names))


def _mcp_annotations(entry: Mapping[str, Any]) -> dict[str, Any]:
    """MCP ``ToolAnnotations`` hints known for an entry (MCP specification, tools).

    The entry's own ``annotations`` (an MCP server's, as the worker read them) come
    first; a tool declared ``idempotent`` adds ``idempotentHint: true`` unless they say
    otherwise.
    """
    given = entry.get("annotations")
    hints: dict[str, Any] = {}
    if isinstance(given, Mapping):
        hints = {key: value for key, value in given.items() if key in _MCP_HINTS}
    if entry.get("idempotent") is True:
        hints.setdefault("idempotentHint", True)
    return hints


_MCP_HINTS = ("title", "readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


_RENDERERS: dict[str, Callable[[Mapping[str, Any]], dict[str, Any]]] = {
    "openai": _openai,
    "openai-strict": _openai_strict,
    "responses": _responses,
    "anthropic": _anthropic,
    "mcp": _mcp,
    "display": _display,
}
