from pydantic import BaseModel

from toolfleet.shared import ExtensionContext, Tool


class A(BaseModel):
    pass


class First(Tool):
    """First tool called same."""

    name = "same"
    arguments_model = A

    def call(self, arguments: A, context: ExtensionContext) -> int:
        return 1


class Second(Tool):
    """Second tool called same."""

    name = "same"
    arguments_model = A

    def call(self, arguments: A, context: ExtensionContext) -> int:
        return 2


tools = [First, Second]
