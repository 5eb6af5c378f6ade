from pydantic import BaseModel

from toolfleet.shared import ExtensionContext, Tool


class PingArguments(BaseModel):
    pass


class Ping(Tool):
    """Answer pong."""

    name = "ping"
    arguments_model = PingArguments

    def call(self, arguments: PingArguments, context: ExtensionContext) -> str:
        return "pong"


tools = [Ping]
