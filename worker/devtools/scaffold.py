"""``toolfleet new NAME``: a new extension folder whose test passes as written.

The folder holds a manifest (``extension.toml``), one class-protocol tool, and a test
that calls it with :func:`toolfleet.testing.run_tool` (no Redis) and through a real fleet
(the ``toolfleet_fleet`` fixture); ``pytest`` in the folder runs it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.manifest import Manifest
from toolfleet.shared.naming import function_name

__all__ = ["module_name", "write_extension"]

_MANIFEST = """\
# The manifest of the {slug} extension: a worker loads this folder when it is named in
# TOOLFLEET_EXTENSION_PATHS; `entry` names the tools (MODULE:ATTR inside this folder).
slug = "{slug}"
version = "0.1.0"
description = "What {slug} does, in one line."
entry = "{module}:tools"
timeout = 5.0  # seconds a call may run
"""

_TOOLS = '''\
"""The tools of the {slug} extension (extension.toml names this module)."""

from pydantic import BaseModel, Field

from toolfleet.shared import ExtensionContext, ExtensionToolError, Tool


class GreetArguments(BaseModel):
    name: str = Field(description="Who to greet.")


class Greet(Tool):
    """Greet someone by name."""

    name = "greet"
    arguments_model = GreetArguments

    def call(self, arguments: GreetArguments, context: ExtensionContext) -> str:
        if not arguments.name.strip():
            raise ExtensionToolError("name: must not be empty")  # the model reads this
        return f"Hello, {{arguments.name}}!"


tools = [Greet]
'''

_TEST = '''\
"""Tests of the {slug} extension: calls answered as a worker answers them, then a fleet."""

from pathlib import Path

from toolfleet.shared import Status
from toolfleet.testing import FleetFactory, run_tool

HERE = Path(__file__).parent  # the extension folder (it holds extension.toml)


def test_greet_answers_the_model() -> None:
    result = run_tool(HERE, "greet", {{"name": "Ada"}})
    assert result.status is Status.OK
    assert result.content == "Hello, Ada!"


def test_arguments_the_tool_refuses_go_back_to_the_model() -> None:
    result = run_tool(HERE, "greet", '{{"name": 5}}')  # the JSON text a model wrote
    assert result.status is Status.INVALID_ARGUMENTS
    assert result.content == {{"error": "name: input should be a valid string"}}


def test_an_empty_name_is_a_tool_error() -> None:
    result = run_tool(HERE, "greet", {{"name": " "}})
    assert result.status is Status.TOOL_ERROR
    assert result.content == {{"error": "name: must not be empty"}}


def test_a_fleet_serves_it(toolfleet_fleet: FleetFactory) -> None:
    fleet = toolfleet_fleet(HERE)
    result = fleet.client.call("{function}", {{"name": "Ada"}})
    assert result.status is Status.OK
    assert result.content == "Hello, Ada!"
'''


def module_name(slug: str) -> str:
    """The Python module of the tools of ``slug``: ``demo-ext`` -> ``demo_ext_tools``.

    Named after the slug so that two extension folders loaded in one process do not
    share a module name (``sys.modules``); ``ext_`` is put first when the slug starts with
    a digit.
    """
    snake = slug.lower().replace("-", "_")
    return f"{'ext_' if snake[0].isdigit() else ''}{snake}_tools"


def write_extension(parent: Path, name: str) -> list[Path]:
    """Write the folder ``parent/name`` of a new extension with slug ``name``.

    Args:
        parent: the folder to create it in (it must exist).
        name: the slug and folder name, e.g. ``demo-ext`` (the manifest's slug rule:
            a letter or digit, then up to 39 letters, digits, ``-`` or ``_``).

    Returns:
        The files written: the manifest, the tools module, the test.

    Raises:
        ConfigurationError: ``name`` is not a valid slug, or ``parent/name`` exists.
    """
    try:
        Manifest(slug=name, version="0.1.0")
    except ValidationError as exc:
        why = str(exc.errors()[0]["msg"]).removeprefix("Value error, ")
        raise ConfigurationError(f"{name!r} is not a valid extension name: {why}") from None
    folder = parent / name
    if folder.exists():
        raise ConfigurationError(f"{folder} exists already; choose another name or remove it")
    module = module_name(name)
    files = {
        folder / "extension.toml": _MANIFEST.format(slug=name, module=module),
        folder / f"{module}.py": _TOOLS.format(slug=name),
        folder / f"test_{module.removesuffix('_tools')}.py": _TEST.format(
            slug=name, function=function_name(name, "greet")
        ),
    }
    folder.mkdir()
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return list(files)
