"""Tool-list export: shapes of every format, strict schemas, and parity with the openai package.

The openai package is a test-only dependency (the ``dev`` extra): the tests that compare
with ``openai.pydantic_function_tool`` skip when it cannot be imported.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from enum import StrEnum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from toolfleet.shared import export
from toolfleet.shared.export import FORMATS, export_tools, strict_problems, to_strict_schema

try:
    import openai
except ImportError:  # pragma: no cover - the dev extra installs it
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise  # CI installs the dev extra: a missing openai must fail, not skip
    openai = None  # type: ignore[assignment]

needs_openai = pytest.mark.skipif(
    openai is None,
    reason="the openai package is not installed; `pip install -e '.[dev]'` to compare the "
    "strict export with openai.pydantic_function_tool",
)

NULL = {"type": "null"}


# --- argument models ---------------------------------------------------------------------


class Address(BaseModel):
    """A postal address."""

    street: str
    city: str = Field(description="City name")


class Person(BaseModel):
    """Store a person (nested model)."""

    name: str
    address: Address


class Search(BaseModel):
    """Search the catalogue (Optional fields)."""

    query: str
    limit: int | None = None
    cursor: str | None = Field(None, description="Where the last page ended")


class Color(StrEnum):
    """A paint colour."""

    red = "red"
    blue = "blue"


class Paint(BaseModel):
    """Paint a wall (enum and Literal)."""

    color: Color
    finish: Literal["matte", "gloss"]
    trim: Color | None = None


class LineItem(BaseModel):
    """One line of an order."""

    sku: str
    quantity: int = Field(ge=1, description="How many")


class Order(BaseModel):
    """Place an order (lists of items)."""

    items: list[LineItem]
    tags: list[str]
    notes: list[str] | None = None


class Page(BaseModel):
    """List results (fields with defaults)."""

    query: str
    size: int = 20
    sort: Literal["asc", "desc"] = "asc"


class Booking(BaseModel):
    """Book a trip (a combination)."""

    traveller: Person = Field(description="Who travels")
    stops: list[Address]
    seat: Literal["window", "aisle"] | None = None
    color: Color = Color.red
    passengers: int = Field(1, ge=1)
    contact: Address | None = None


class Link(BaseModel):
    """A recursive model whose self-reference carries a description."""

    value: int
    next: Link | None = None
    loop: Link = Field(description="points back")


class Settings(BaseModel):
    """A model with an open map, which strict mode cannot express."""

    name: str
    labels: dict[str, int]


MATCHING_MODELS = [Person, Search, Paint, Order]


def _entry(model: type[BaseModel], **extra: Any) -> dict[str, Any]:
    return {
        "name": model.__name__,
        "description": model.__doc__,
        "parameters": model.model_json_schema(),
        **extra,
    }


def _sdk_tool(model: type[BaseModel]) -> dict[str, Any]:
    assert openai is not None
    return dict(openai.pydantic_function_tool(model))


def _objects(schema: Any, path: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object schema in ``schema``, at any depth (including $defs), with its path."""
    if isinstance(schema, dict):
        if schema.get("type") == "object" or "properties" in schema:
            yield path, schema
        for key, value in schema.items():
            yield from _objects(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            yield from _objects(value, f"{path}/{i}")


def _scramble(value: Any) -> None:
    """Empty every dict and list inside ``value``, depth first."""
    children = value.values() if isinstance(value, dict) else value
    if isinstance(value, (dict, list)):
        for child in list(children):
            _scramble(child)
        value.clear()


# --- parity with the openai package --------------------------------------------------------


@needs_openai
@pytest.mark.parametrize("model", MATCHING_MODELS, ids=lambda m: m.__name__)
def test_strict_export_equals_openai_pydantic_function_tool(model: type[BaseModel]) -> None:
    """Models without non-null defaults export exactly as openai.pydantic_function_tool does."""
    (ours,) = export_tools([_entry(model)], "openai-strict")
    sdk = _sdk_tool(model)
    assert ours["function"]["parameters"] == sdk["function"]["parameters"]
    assert ours["function"]["strict"] is sdk["function"]["strict"] is True
    assert ours == sdk


@needs_openai
@pytest.mark.parametrize("model", MATCHING_MODELS, ids=lambda m: m.__name__)
def test_responses_export_equals_openai_pydantic_responses_function_tool(
    model: type[BaseModel],
) -> None:
    """The responses format equals openai.pydantic_responses_function_tool for the same model."""
    build = getattr(openai, "pydantic_responses_function_tool", None)
    if build is None:
        pytest.skip("this openai version has no pydantic_responses_function_tool")
    (ours,) = export_tools([_entry(model)], "responses")
    assert ours == dict(build(model))


@needs_openai
def test_defaulted_fields_become_nullable_where_the_sdk_keeps_them_non_nullable() -> None:
    """Deliberate difference: a field with a non-null default is nullable in our strict schema.

    The openai package makes ``size: int = 20`` required and integer-only, so the model must
    always invent a size and can never ask for the default. OpenAI's Structured Outputs guide
    says to emulate an optional field with a union with null; we do that, keeping the title
    beside the anyOf (pydantic's own shape for Optional fields) and moving the default, which
    strict mode does not take, into the description.
    """
    ours = export_tools([_entry(Page)], "openai-strict")[0]["function"]
    sdk = _sdk_tool(Page)["function"]
    assert ours["strict"] is sdk["strict"] is True

    assert sdk["parameters"]["properties"]["size"] == {
        "default": 20,
        "title": "Size",
        "type": "integer",
    }
    assert ours["parameters"]["properties"]["size"] == {
        "anyOf": [{"type": "integer"}, NULL],
        "description": "Default: 20.",
        "title": "Size",
    }
    assert sdk["parameters"]["properties"]["sort"] == {
        "default": "asc",
        "enum": ["asc", "desc"],
        "title": "Sort",
        "type": "string",
    }
    assert ours["parameters"]["properties"]["sort"] == {
        "anyOf": [{"enum": ["asc", "desc"], "type": "string"}, NULL],
        "description": 'Default: "asc".',
        "title": "Sort",
    }
    # Everything else is the same: the required field, required list, closed object.
    for key in ("size", "sort"):
        del ours["parameters"]["properties"][key], sdk["parameters"]["properties"][key]
    assert ours == sdk


@needs_openai
def test_combination_differs_from_sdk_only_in_defaulted_fields() -> None:
    """A model mixing nested, described, Optional, enum, list and defaulted fields.

    Same as the openai package (described ``$ref`` inlined, bare ``$ref`` kept, ``$defs``
    closed and fully required, ``default: null`` dropped, ``minimum`` kept) except for the
    deliberate difference: the two fields with non-null defaults, ``color`` (an enum
    ``$ref`` with a default, inlined by both) and ``passengers``, are nullable in ours, and
    their default is words of the description.
    """
    ours = export_tools([_entry(Booking)], "openai-strict")[0]["function"]
    sdk = _sdk_tool(Booking)["function"]
    assert ours["strict"] is sdk["strict"] is True

    params, sdk_params = ours["parameters"], sdk["parameters"]
    differing = {"color", "passengers"}
    for key in differing:
        mine, theirs = params["properties"].pop(key), sdk_params["properties"].pop(key)
        annotations = {k: theirs[k] for k in ("title", "description", "default") if k in theirs}
        body = {k: v for k, v in theirs.items() if k not in annotations}
        assert NULL not in theirs.get("anyOf", []), f"{key}: the SDK keeps it non-nullable"
        default = annotations.pop("default")
        described = " ".join(filter(None, [annotations.pop("description", ""), "Default:"]))
        annotations["description"] = f"{described} {json.dumps(default)}."
        assert mine == {"anyOf": [body, NULL], **annotations}, key
    assert ours == sdk
    # The described nested model was inlined (like the SDK), the Optional one kept as $ref.
    assert "$ref" not in params["properties"]["traveller"]
    assert params["properties"]["contact"] == {"anyOf": [{"$ref": "#/$defs/Address"}, NULL]}


# --- strict schema rules ----------------------------------------------------------------------


@pytest.mark.parametrize("model", [*MATCHING_MODELS, Page, Booking, Link], ids=lambda m: m.__name__)
def test_strict_schemas_are_closed_and_fully_required_at_every_level(
    model: type[BaseModel],
) -> None:
    """Every object, nested or in $defs, has additionalProperties false and all keys required."""
    schema = to_strict_schema(model.model_json_schema())
    objects = list(_objects(schema))
    assert objects
    for path, node in objects:
        assert node["additionalProperties"] is False, path
        assert node["required"] == list(node["properties"]), path
    assert strict_problems(schema) == []


def test_optional_properties_become_nullable_in_a_hand_written_schema() -> None:
    """Optional properties of a metadata-dict schema become nullable; nullable ones stay."""
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City"},
            "days": {"type": "integer", "description": "How many days", "default": 3},
            "unit": {"type": ["string", "null"], "enum": ["c", "f", None]},
            "anything": {"description": "any JSON value"},
            "where": {
                "type": "object",
                "properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                "required": ["lat"],
            },
        },
        "required": ["city"],
    }
    strict = to_strict_schema(schema)
    props = strict["properties"]
    assert strict["required"] == ["city", "days", "unit", "anything", "where"]
    assert strict["additionalProperties"] is False
    assert props["city"] == {"type": "string", "description": "City"}
    assert props["days"] == {
        "anyOf": [{"type": "integer"}, NULL],
        "description": "How many days. Default: 3.",
    }
    assert props["unit"] == schema["properties"]["unit"]
    assert props["anything"] == {"description": "any JSON value"}
    assert props["where"] == {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "lat": {"type": "number"},
                    "lon": {"anyOf": [{"type": "number"}, NULL]},
                },
                "required": ["lat", "lon"],
                "additionalProperties": False,
            },
            NULL,
        ]
    }


def test_a_union_default_is_widened_not_nested() -> None:
    """An optional anyOf gains a null variant instead of being wrapped in another anyOf."""
    schema = {
        "type": "object",
        "properties": {"x": {"anyOf": [{"type": "integer"}, {"type": "string"}], "default": 1}},
    }
    assert to_strict_schema(schema)["properties"]["x"] == {
        "anyOf": [{"type": "integer"}, {"type": "string"}, NULL],
        "description": "Default: 1.",
    }


@pytest.mark.parametrize("model", [*MATCHING_MODELS, Page, Booking, Link], ids=lambda m: m.__name__)
def test_to_strict_schema_is_idempotent(model: type[BaseModel]) -> None:
    """Applying to_strict_schema twice gives the same schema as once."""
    once = to_strict_schema(model.model_json_schema())
    assert to_strict_schema(once) == once


def test_recursive_reference_with_a_description_is_not_inlined_forever() -> None:
    """A self-reference with siblings, met while inlining itself, becomes an anyOf of its $ref.

    The root of a recursive pydantic model is itself a ``$ref`` with siblings (``$defs``),
    so the root is inlined and ``loop`` inside it is already a reference to the model being
    inlined. The openai package inlines such a reference without end.
    """
    schema = to_strict_schema(Link.model_json_schema())
    described_ref = {"anyOf": [{"$ref": "#/$defs/Link"}], "description": "points back"}
    assert "$ref" not in schema
    assert schema["properties"]["loop"] == described_ref
    inlined_once = schema["$defs"]["Link"]["properties"]["loop"]
    assert inlined_once["description"] == "points back"
    assert inlined_once["properties"]["loop"] == described_ref
    assert strict_problems(schema) == []


def test_single_all_of_is_merged_into_its_parent() -> None:
    """A one-entry allOf (older pydantic's described $ref) is merged, then the $ref inlined."""
    schema = {
        "type": "object",
        "properties": {"a": {"allOf": [{"$ref": "#/$defs/A"}], "description": "an A"}},
        "required": ["a"],
        "$defs": {"A": {"type": "object", "properties": {"x": {"type": "string"}}}},
    }
    assert to_strict_schema(schema)["properties"]["a"] == {
        "type": "object",
        "description": "an A",
        "properties": {"x": {"anyOf": [{"type": "string"}, NULL]}},
        "required": ["x"],
        "additionalProperties": False,
    }


def test_non_local_reference_is_a_value_error() -> None:
    """A $ref outside the schema cannot be inlined: ValueError."""
    schema = {"type": "object", "properties": {"a": {"$ref": "other.json#/A", "title": "A"}}}
    with pytest.raises(ValueError, match="not local"):
        to_strict_schema(schema)


def test_strict_problems_names_what_strict_mode_rejects() -> None:
    """strict_problems reports a non-object root, open objects, missing required and oneOf."""
    assert strict_problems({"anyOf": [{"type": "string"}]}) == [
        "#: the root must be an object schema"
    ]
    problems = strict_problems(
        {
            "type": "object",
            "properties": {
                "m": {"type": "object", "additionalProperties": {"type": "integer"}},
                "u": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
            },
            "required": ["m"],
            "additionalProperties": False,
        }
    )
    assert problems == [
        "#: every property must be required",
        "#/properties/m: additionalProperties must be false (open objects are not)",
        "#/properties/u: oneOf is not supported",
    ]


# --- export: formats ---------------------------------------------------------------------


def test_openai_shape_is_the_chat_completions_function_tool() -> None:
    """openai: {"type": "function", "function": {name, description, parameters}}, no strict."""
    entry = _entry(Page)
    assert export_tools([entry], "openai") == [
        {
            "type": "function",
            "function": {
                "name": "Page",
                "description": Page.__doc__,
                "parameters": Page.model_json_schema(),
            },
        }
    ]


def test_openai_is_the_default_format() -> None:
    """export_tools without a format renders Chat Completions tools."""
    assert export_tools([_entry(Page)]) == export_tools([_entry(Page)], "openai")


def test_openai_strict_shape() -> None:
    """openai-strict: the Chat Completions shape with strict true and the strict schema."""
    (tool,) = export_tools([_entry(Page)], "openai-strict")
    assert tool == {
        "type": "function",
        "function": {
            "name": "Page",
            "description": Page.__doc__,
            "parameters": to_strict_schema(Page.model_json_schema()),
            "strict": True,
        },
    }


def test_responses_shape_is_flat_and_strict() -> None:
    """responses: a flat function tool with the strict schema and strict true."""
    (tool,) = export_tools([_entry(Page)], "responses")
    assert tool == {
        "type": "function",
        "name": "Page",
        "description": Page.__doc__,
        "parameters": to_strict_schema(Page.model_json_schema()),
        "strict": True,
    }


def test_anthropic_shape_uses_input_schema() -> None:
    """anthropic: {name, description, input_schema} with the schema as given."""
    assert export_tools([_entry(Page)], "anthropic") == [
        {"name": "Page", "description": Page.__doc__, "input_schema": Page.model_json_schema()}
    ]


def test_mcp_shape_uses_input_schema_and_display_name_as_title() -> None:
    """mcp: {name, title, description, inputSchema}; title only when display_name is given."""
    entries = [
        _entry(Page, display_name="List pages", display_description="For people"),
        _entry(Search),
    ]
    assert export_tools(entries, "mcp") == [
        {
            "name": "Page",
            "title": "List pages",
            "description": Page.__doc__,
            "inputSchema": Page.model_json_schema(),
        },
        {
            "name": "Search",
            "description": Search.__doc__,
            "inputSchema": Search.model_json_schema(),
        },
    ]


def test_mcp_shape_carries_annotations_and_output_schema_when_known() -> None:
    """mcp: the entry's MCP hints (only MCP's keys), idempotentHint for an idempotent tool,
    and its output_schema as outputSchema; absent when nothing is known."""
    out = {"type": "object", "properties": {"time": {"type": "string"}}}
    entries = [
        {
            **_entry(Page),
            "annotations": {"readOnlyHint": True, "destructiveHint": False, "other": 1},
            "output_schema": out,
        },
        {**_entry(Search), "idempotent": True},
        {**_entry(Search), "idempotent": True, "annotations": {"idempotentHint": False}},
    ]
    first, second, third = export_tools(entries, "mcp")
    assert first["annotations"] == {"readOnlyHint": True, "destructiveHint": False}
    assert first["outputSchema"] == out and first["outputSchema"] is not out
    assert second["annotations"] == {"idempotentHint": True} and "outputSchema" not in second
    assert third["annotations"] == {"idempotentHint": False}
    (plain,) = export_tools([_entry(Page)], "mcp")
    assert "annotations" not in plain and "outputSchema" not in plain


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "display"])
def test_display_description_is_never_sent_to_the_model(fmt: str) -> None:
    """display_description is for people: no model format carries it."""
    (tool,) = export_tools([_entry(Page, display_description="SECRET-ISH")], fmt)
    assert "SECRET-ISH" not in repr(tool)


@pytest.mark.parametrize("fmt", ["openai-strict", "responses"])
def test_schema_strict_mode_cannot_express_is_exported_non_strict(fmt: str) -> None:
    """A tool with an open map goes out with strict false and its schema unchanged."""
    (tool,) = export_tools([_entry(Settings)], fmt)
    function = tool.get("function", tool)
    assert function["strict"] is False
    assert function["parameters"] == Settings.model_json_schema()


@pytest.mark.parametrize("fmt", ["openai-strict", "responses"])
def test_unresolvable_reference_is_exported_non_strict(fmt: str) -> None:
    """A schema whose $ref cannot be resolved goes out with strict false, not an error."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/Missing", "title": "A"}}}
    (tool,) = export_tools([{"name": "t", "description": "d", "parameters": schema}], fmt)
    function = tool.get("function", tool)
    assert function["strict"] is False
    assert function["parameters"] == schema


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "display"])
def test_entry_without_parameters_gets_an_empty_object_schema(fmt: str) -> None:
    """A missing parameters schema becomes an object with no properties (closed when strict)."""
    (tool,) = export_tools([{"name": "ping", "description": "Ping."}], fmt)
    function = tool.get("function", tool)
    schema = function.get("parameters") or function.get("input_schema") or tool["inputSchema"]
    assert schema["type"] == "object" and schema["properties"] == {}
    if fmt in ("openai-strict", "responses"):
        assert schema == {
            "type": "object",
            "properties": {},
            "required": [],
            "additionalProperties": False,
        }
        assert function["strict"] is True


def test_unknown_format_is_a_value_error() -> None:
    """An unknown format raises ValueError naming the known ones."""
    with pytest.raises(ValueError, match="openai-strict"):
        export_tools([_entry(Page)], "gemini")


def test_entry_without_a_name_is_a_value_error() -> None:
    """An entry without a string name raises ValueError."""
    with pytest.raises(ValueError, match="without a name"):
        export_tools([{"description": "d", "parameters": {}}], "openai")


@pytest.mark.parametrize("fmt", FORMATS)
def test_export_leaves_its_input_unchanged_and_unshared(fmt: str) -> None:
    """Export neither mutates the entries nor returns objects shared with them."""
    entries = [_entry(model, display_name=model.__name__) for model in (Booking, Link, Settings)]
    before = copy.deepcopy(entries)
    tools = export_tools(entries, fmt)
    assert entries == before
    for tool in tools:
        _scramble(tool)
    assert entries == before


def test_to_strict_schema_leaves_its_input_unchanged() -> None:
    """to_strict_schema returns a new schema and does not change the one it is given."""
    schema = Booking.model_json_schema()
    before = copy.deepcopy(schema)
    to_strict_schema(schema)
    assert schema == before


def test_public_names() -> None:
    """The module publishes exactly its documented names, five model formats and display."""
    assert sorted(export.__all__) == [
        "FORMATS",
        "SCHEMA_HASH_KEY",
        "export_tools",
        "strict_problems",
        "to_strict_schema",
    ]
    assert FORMATS == ("openai", "openai-strict", "responses", "anthropic", "mcp", "display")


def test_display_keeps_the_type_of_optional_parameters() -> None:
    """display: an optional parameter reads as its type, not null, whatever the schema's
    shape for "T or null" (pydantic's anyOf, a type list, oneOf, a $ref to an enum)."""

    class Booking(BaseModel):
        """Book."""

        room: str
        discount_code: str | None = None
        nights: int | None = Field(None, description="How many")
        trim: Color | None = None
        size: Literal["s", "m"] | None = None
        tags: list[str] | None = None
        either: int | str | None = None

    (tool,) = export_tools([_entry(Booking)], "display")
    assert {p["name"]: p["type"] for p in tool["parameters"]} == {
        "room": "string",
        "discount_code": "string",
        "nights": "integer",
        "trim": "string",
        "size": "string",
        "tags": "array",
        "either": "integer | string",
    }
    assert [p["required"] for p in tool["parameters"]] == [True] + [False] * 6
    hand_written = {
        "type": "object",
        "properties": {
            "a": {"type": ["number", "null"]},
            "b": {"oneOf": [{"type": "null"}, {"type": "boolean"}]},
            "c": {"description": "anything"},
            "d": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]},
        },
        "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}}},
    }
    (raw,) = export_tools([{"name": "t", "parameters": hand_written}], "display")
    assert [p["type"] for p in raw["parameters"]] == ["number", "boolean", None, "object"]
