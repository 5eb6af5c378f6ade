"""Tools of the Smarter-style seed extension."""

from pydantic import BaseModel, Field

from toolfleet.shared import ExtensionContext, Tool


class ShoutArguments(BaseModel):
    text: str = Field(description="What to shout.")


class Shout(Tool):
    """Upper-case a text."""

    name = "shout"
    arguments_model = ShoutArguments

    def call(self, arguments: ShoutArguments, context: ExtensionContext) -> str:
        return arguments.text.upper()


tools = [Shout]
