"""The same ``greet`` tool as a class, a metadata plugin, a deftool toolkit and a delegate."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.shared import Extension, ExtensionContext, ExtensionToolError, Tool
from toolfleet.shared.plugin import MetadataPlugin
from toolfleet.shared.toolkit import Toolkit

DEFINITIONS = Path(__file__).with_name("definitions.json")


def greet(name: str, punctuation: str = "!") -> str:
    if not name.strip():
        raise ExtensionToolError("name: must not be empty")
    return f"Hello, {name}{punctuation}"


# 1. class protocol
class GreetArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="Who to greet.")
    punctuation: str = Field(default="!", description="Ends the greeting.")


class Greet(Tool):
    """Greet someone by name."""

    name = "greet"
    arguments_model = GreetArguments

    def call(self, arguments: GreetArguments, context: ExtensionContext) -> str:
        return greet(arguments.name, arguments.punctuation)


# 2. metadata plugin
class GreetPlugin(MetadataPlugin):
    def get_metadata(self) -> dict[str, Any]:
        return {
            "name": "greet",
            "displayName": "Greeter",
            "description": "Greet someone by name.",
            "displayDescription": "Says hello",
            "parameters": {
                "name": {"type": "string", "description": "Who to greet.", "required": True},
                "punctuation": {"type": "string", "description": "Ends the greeting."},
            },
        }

    def invoke(self, **kwargs: Any) -> str:
        return greet(kwargs["name"], kwargs.get("punctuation") or "!")


# 3. toolkit built at run time
kit = Toolkit()
kit.deftool(
    "greet", "Greet someone by name.", json.loads(DEFINITIONS.read_text())[0]["parameters"], greet
)


# 4. delegate over a file of JSON function definitions
class FileDelegate:
    def __init__(self, path: Path) -> None:
        self.path = path

    def get_tools(self) -> list[dict[str, Any]]:
        return list(json.loads(self.path.read_text()))

    async def execute(self, name: str, arguments: dict[str, Any], context: Any) -> Any:
        if name != "greet":
            raise ExtensionToolError(f"no tool {name}")
        return greet(**arguments)


class_style = Extension(slug="style-class", version="1", tools=[Greet])
metadata_style = Extension(slug="style-meta", version="1", tools=[GreetPlugin])
toolkit_style = Extension(slug="style-kit", version="1", tools=[kit])
delegate_style = Extension(slug="style-delegate", version="1", tools=[FileDelegate(DEFINITIONS)])
