from toolfleet.shared import Tool


class NoModel(Tool):
    name = "no model here"

    def call(self, arguments, context):  # type: ignore[no-untyped-def]
        return None


tools = [NoModel]
