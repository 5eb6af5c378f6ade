"""Metadata plugins: tools described by a metadata dict, invoked with keyword arguments.

The shape people bring from plugin-style tool frameworks::

    class Weather(MetadataPlugin):
        def get_metadata(self) -> dict:
            return {
                "name": "weather",
                "displayName": "Weather",
                "description": "Current weather for a city.",
                "displayDescription": "Looks up the weather",
                "parameters": {
                    "city": {"type": "string", "description": "City name", "required": True},
                    "units": {"type": "string", "description": "metric or imperial"},
                },
            }

        def invoke(self, **kwargs) -> str:
            return f"sunny in {kwargs['city']}"

Every subclass is registered when its class statement runs (:meth:`MetadataPlugin.registry`).
"""

from __future__ import annotations

from typing import Any, ClassVar

__all__ = ["MetadataPlugin", "metadata_display", "metadata_to_schema"]

_TYPE_NAMES = {
    "string": "string",
    "str": "string",
    "integer": "integer",
    "int": "integer",
    "number": "number",
    "float": "number",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "object": "object",
    "dict": "object",
}


class MetadataPlugin:
    """Base class of a metadata plugin; subclasses are discovered automatically."""

    _registry: ClassVar[list[type[MetadataPlugin]]] = []

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        MetadataPlugin._registry.append(cls)

    @classmethod
    def registry(cls) -> list[type[MetadataPlugin]]:
        """Every subclass defined so far (in definition order)."""
        return list(MetadataPlugin._registry)

    def get_metadata(self) -> dict[str, Any]:
        """``{name, displayName, description, displayDescription, parameters}``."""
        raise NotImplementedError

    def invoke(self, **kwargs: Any) -> Any:
        """Run the tool with validated keyword arguments; usually returns a string."""
        raise NotImplementedError


def metadata_to_schema(parameters: dict[str, Any]) -> dict[str, Any]:
    """Turn a metadata ``parameters`` mapping into a JSON Schema object.

    ``displayDescription`` stays out of the schema (it is for people, not the model);
    :func:`metadata_display` collects it.

    Args:
        parameters: ``{arg: {type, description, displayDescription?, required?, enum?,
            items?, default?}}``.

    Returns:
        ``{"type": "object", "properties": {...}, "required": [...]}``.

    Raises:
        ValueError: an argument's spec is not a mapping or names an unknown type.
    """
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, spec in parameters.items():
        if not isinstance(spec, dict):
            raise ValueError(f"parameter {name!r}: spec must be a mapping")
        raw_type = str(spec.get("type", "string")).lower()
        if raw_type not in _TYPE_NAMES:
            raise ValueError(f"parameter {name!r}: unknown type {spec.get('type')!r}")
        prop: dict[str, Any] = {"type": _TYPE_NAMES[raw_type]}
        for key in ("description", "enum", "items", "default"):
            if key in spec:
                prop[key] = spec[key]
        properties[name] = prop
        if spec.get("required"):
            required.append(name)
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def metadata_display(parameters: dict[str, Any]) -> dict[str, str]:
    """The ``displayDescription`` of each parameter that has one: ``{arg: text}``."""
    return {
        name: str(spec["displayDescription"])
        for name, spec in parameters.items()
        if isinstance(spec, dict) and spec.get("displayDescription")
    }
