"""Strict export without semantic drift, and distinct names for clashing tools.

``null`` for an optional argument reaches every tool style as its default; schemas strict
mode cannot take are exported non-strict with a logged reason; strict tools carry no
``default``/``minLength``/``maxLength``; two extensions whose tools map to one function
name both serve under hashed names that the catalog maps back.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import pytest
from pydantic import BaseModel

from toolfleet.extensions.bfcl import extension as bfcl_extension
from toolfleet.extensions.date_calculator import extension as date_extension
from toolfleet.extensions.python import extension as python_extension
from toolfleet.shared import Extension, ExtensionContext, Status, Tool, ToolCallRequest
from toolfleet.shared.export import export_tools
from toolfleet.shared.naming import extension_for, function_name, function_names, tool_name_for
from toolfleet.shared.plugin import MetadataPlugin
from toolfleet.shared.toolkit import Toolkit as DefToolkit
from toolfleet.testing import run_tool
from toolfleet.worker.pipeline.calls import CallPipeline
from toolfleet.worker.registry.registry import Registry

PARAMETERS = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "description": "What to echo."},
        "times": {"type": "integer", "description": "How often."},
        "sep": {"type": "string", "description": "Between copies.", "default": "-"},
    },
    "required": ["text"],
}


def echo(text: str, times: int = 2, sep: str = "+") -> str:
    """The handler's own defaults are what a null must mean (times=2, sep="+")."""
    return sep.join([text] * times)


class EchoArguments(BaseModel):
    text: str
    times: int = 2
    sep: str = "+"


class EchoTool(Tool):
    """Echo a text."""

    name = "echo"
    arguments_model = EchoArguments

    def call(self, arguments: EchoArguments, context: ExtensionContext) -> str:
        return echo(arguments.text, arguments.times, arguments.sep)


class EchoPlugin(MetadataPlugin):
    def get_metadata(self) -> dict[str, Any]:
        return {
            "name": "echo",
            "description": "Echo a text.",
            "parameters": {
                "text": {"type": "string", "description": "What to echo.", "required": True},
                "times": {"type": "integer", "description": "How often."},
                "sep": {"type": "string", "description": "Between copies."},
            },
        }

    def invoke(self, **kwargs: Any) -> str:
        return echo(**kwargs)


class EchoDelegate:
    def get_tools(self) -> list[dict[str, Any]]:
        return [{"name": "echo", "description": "Echo a text.", "parameters": PARAMETERS}]

    def execute(self, name: str, arguments: dict[str, Any], context: Any) -> Any:
        return echo(**arguments)


def _kit() -> DefToolkit:
    kit = DefToolkit()
    kit.deftool("echo", "Echo a text.", PARAMETERS, echo)
    return kit


STYLES: dict[str, Any] = {
    "class": EchoTool,
    "metadata": EchoPlugin,
    "toolkit": _kit(),
    "delegate": EchoDelegate(),
}


def _call(registry: Registry, function: str, arguments: Any) -> Any:
    request = ToolCallRequest(
        id=str(uuid.uuid4()),
        function=function,
        arguments=arguments,
        reply_to="unused",
        deadline=time.time() + 10,
        timeout_s=10,
    )
    pipeline = CallPipeline(registry)
    try:
        return pipeline.call(request)
    finally:
        pipeline.close()


@pytest.mark.parametrize("style", sorted(STYLES))
def test_null_for_an_optional_argument_reaches_every_style_as_its_default(style: str) -> None:
    """{"times": null, "sep": null} runs like {} for class, metadata, deftool and delegate tools."""
    extension = Extension(slug=f"nulls-{style}", version="1", tools=[STYLES[style]])
    left_out = run_tool(extension, "echo", {"text": "a"})
    nulled = run_tool(extension, "echo", '{"text": "a", "times": null, "sep": null}')
    assert left_out.status is Status.OK, left_out.content
    assert nulled.status is Status.OK, nulled.content
    assert nulled.content == left_out.content == "a+a"


def test_null_for_a_required_argument_is_still_invalid_in_every_style() -> None:
    """The null rule never turns a missing required argument into a default."""
    for style, definition in STYLES.items():
        extension = Extension(slug=f"req-{style}", version="1", tools=[definition])
        result = run_tool(extension, "echo", {"text": None})
        assert result.status is Status.INVALID_ARGUMENTS, (style, result.content)


# --- strict export ---------------------------------------------------------------------------


def _keywords(schema: Any, path: str = "#") -> Iterator[tuple[str, str]]:
    if isinstance(schema, Mapping):
        for key, value in schema.items():
            if key != "properties":
                yield path, key
            if isinstance(value, Mapping) and key == "properties":
                for name, sub in value.items():
                    yield from _keywords(sub, f"{path}/properties/{name}")
            elif isinstance(value, (Mapping, list)):
                yield from _keywords(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, item in enumerate(schema):
            yield from _keywords(item, f"{path}/{i}")


def _builtin_entries() -> list[dict[str, Any]]:
    registry = Registry()
    # the python tool's schema, whether or not this host can run its sandbox (its preflight)
    for ext in (bfcl_extension, date_extension, replace(python_extension, preflight=None)):
        registry.add_extension(ext)
    return [served.catalog_entry().model_dump(mode="json") for served in registry.served.values()]


@pytest.mark.parametrize("fmt", ["openai-strict", "responses"])
def test_strict_builtin_tools_carry_no_default_or_length_keywords(fmt: str) -> None:
    """No strict tool of the built-in extensions has default, minLength or maxLength."""
    entries = _builtin_entries()
    tools = export_tools(entries, fmt)
    strict = [t.get("function", t) for t in tools if t.get("function", t)["strict"]]
    assert len(strict) == len(entries), "every built-in tool exports strict"
    refused = {"default", "minLength", "maxLength"}
    found = [
        (t["name"], path, key)
        for t in strict
        for path, key in _keywords(t["parameters"])
        if key in refused
    ]
    assert found == []
    run = next(t for t in strict if t["name"] == "ext_python_run")
    assert "characters" in run["parameters"]["properties"]["code"]["description"]


def test_untyped_property_is_exported_non_strict_with_a_logged_reason(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A value of any type cannot be strict: strict false, original schema, reason logged."""
    schema = {
        "type": "object",
        "properties": {"value": {"description": "any JSON value"}, "n": {"type": "integer"}},
        "required": ["value", "n"],
        "additionalProperties": False,
    }
    entry = {"name": f"anything_{uuid.uuid4().hex[:6]}", "description": "d", "parameters": schema}
    with caplog.at_level(logging.WARNING, logger="toolfleet.export"):
        (tool,) = export_tools([entry], "openai-strict")
        export_tools([entry], "responses")
    assert tool["function"]["strict"] is False
    assert tool["function"]["parameters"] == schema
    reasons = [r.getMessage() for r in caplog.records if entry["name"] in r.getMessage()]
    assert reasons == [
        f"{entry['name']} is exported with strict false: "
        "#/properties/value: a value of any type is not supported"
    ], "logged once, with the reason"


# --- names -----------------------------------------------------------------------------------


def _named(tool_name: str) -> type[Tool]:
    class Named(Tool):
        """Say which tool answered."""

        name = tool_name
        arguments_model = EchoArguments

        def call(self, arguments: EchoArguments, context: ExtensionContext) -> str:
            return f"{context.slug}/{tool_name}"

    return Named


def test_clashing_function_names_of_two_extensions_both_serve_under_hashed_names() -> None:
    """a-b/c and a/b_c both map to ext_a_b_c: both get distinct hashed names and answer."""
    first = Extension(slug="a-b", version="1", tools=[_named("c")])
    second = Extension(slug="a", version="1", tools=[_named("b_c"), _named("other")])
    registry = Registry()
    registry.add_extension(first)
    registry.add_extension(second)
    assert registry.errors == {}
    hashed_first = function_name("a-b", "c", hashed=True)
    hashed_second = function_name("a", "b_c", hashed=True)
    assert hashed_first != hashed_second
    assert hashed_first.startswith("ext_a_b_c_") and len(hashed_first) == len("ext_a_b_c_") + 8
    assert set(registry.served) == {hashed_first, hashed_second, "ext_a_other"}
    assert _call(registry, hashed_first, {"text": "x"}).content == "a-b/c"
    assert _call(registry, hashed_second, {"text": "x"}).content == "a/b_c"
    # load order does not change the names
    reverse = Registry()
    reverse.add_extension(second)
    reverse.add_extension(first)
    assert set(reverse.served) == set(registry.served)


def test_hashed_names_map_back_to_extension_and_tool_through_the_catalog() -> None:
    """tool_name_for and extension_for recover the original names from catalog entries."""
    registry = Registry()
    registry.add_extension(Extension(slug="a-b", version="1", tools=[_named("c")]))
    registry.add_extension(Extension(slug="a", version="1", tools=[_named("b_c")]))
    catalog = {
        name: served.catalog_entry().model_dump(mode="json")
        for name, served in registry.served.items()
    }
    hashed = function_name("a", "b_c", hashed=True)
    assert tool_name_for(hashed, catalog) == "b_c"
    assert extension_for(hashed, catalog) == "a"
    assert tool_name_for(function_name("a-b", "c", hashed=True), catalog) == "c"
    assert extension_for(function_name("a-b", "c", hashed=True), catalog) == "a-b"
    # a name not in the catalog falls back to the slugs the catalog knows
    assert extension_for("ext_a_b_new", catalog) == "a-b"
    assert tool_name_for("ext_a_b_new", catalog) == "new"


def test_function_names_hash_every_member_of_a_clash_and_nothing_else() -> None:
    """Only pairs whose plain names clash are hashed; the rest keep their plain names."""
    names = function_names([("a-b", "c"), ("a", "b_c"), ("a", "d"), ("a", "d")])
    assert names[("a", "d")] == "ext_a_d"
    assert names[("a-b", "c")] == function_name("a-b", "c", hashed=True)
    assert names[("a", "b_c")] == function_name("a", "b_c", hashed=True)
    assert len(set(names.values())) == 3
