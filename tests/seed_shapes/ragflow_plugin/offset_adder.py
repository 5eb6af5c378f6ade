"""A plugin file in RAGFlow's own shape: its import path, base class and method shapes."""

import logging

from plugin.llm_tool_plugin import LLMToolMetadata, LLMToolPlugin


class OffsetAdderPlugin(LLMToolPlugin):
    """Adds two numbers and 100 (a deliberately odd calculator for tests)."""

    _version_ = "1.0.0"

    @classmethod
    def get_metadata(cls) -> LLMToolMetadata:
        return {
            "name": "offset_adder",
            "displayName": "$t:offset_adder.name",
            "description": "Add two numbers, then add 100 to the sum.",
            "displayDescription": "$t:offset_adder.description",
            "parameters": {
                "a": {
                    "type": "number",
                    "description": "The first number",
                    "displayDescription": "$t:offset_adder.params.a",
                    "required": True,
                },
                "b": {
                    "type": "number",
                    "description": "The second number",
                    "displayDescription": "$t:offset_adder.params.b",
                    "required": True,
                },
            },
        }

    def invoke(self, a: int, b: int) -> str:
        logging.info("offset_adder called with %s and %s", a, b)
        return str(a + b + 100)
