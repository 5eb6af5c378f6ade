"""A plugin file on RAGFlow's current import path (``agent.plugin``), as RAGFlow writes one."""

import logging

from agent.plugin.llm_tool_plugin import LLMToolMetadata, LLMToolPlugin


class ScaledAdderPlugin(LLMToolPlugin):
    """Adds two numbers and multiplies the sum by ten (an odd calculator for tests)."""

    _version_ = "1.0.0"

    @classmethod
    def get_metadata(cls) -> LLMToolMetadata:
        return {
            "name": "scaled_adder",
            "displayName": "$t:scaled_adder.name",
            "description": "Add two numbers, then multiply the sum by ten.",
            "displayDescription": "$t:scaled_adder.description",
            "parameters": {
                "a": {
                    "type": "number",
                    "description": "The first number",
                    "displayDescription": "$t:scaled_adder.params.a",
                    "required": True,
                },
                "b": {
                    "type": "number",
                    "description": "The second number",
                    "displayDescription": "$t:scaled_adder.params.b",
                    "required": True,
                },
            },
        }

    def invoke(self, a: int, b: int) -> str:
        logging.info("scaled_adder called with %s and %s", a, b)
        return str((a + b) * 10)
