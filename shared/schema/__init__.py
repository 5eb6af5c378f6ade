"""JSON Schema import: the BFCL dialect to standard JSON Schema, and schemas to pydantic.

- :mod:`toolfleet.shared.schema.dialect`: :func:`normalize_parameters` (BFCL → JSON
  Schema), :func:`sanitize_function_name` and :class:`FunctionNameMap` (OpenAI names,
  ``^[a-zA-Z0-9_-]{1,64}$``), :func:`load_function_definitions` (BFCL question files).
- :mod:`toolfleet.shared.schema.model`: :func:`model_from_schema` (JSON Schema →
  pydantic v2 model that validates tool-call arguments).
"""

from toolfleet.shared.schema.dialect import (
    TYPE_MAP,
    FunctionDefinition,
    FunctionNameMap,
    load_function_definitions,
    normalize_parameters,
    normalize_type,
    sanitize_function_name,
)
from toolfleet.shared.schema.errors import SchemaError
from toolfleet.shared.schema.model import model_from_schema

__all__ = [
    # BFCL dialect → JSON Schema
    "TYPE_MAP",
    "FunctionDefinition",
    "load_function_definitions",
    "normalize_parameters",
    "normalize_type",
    # names
    "FunctionNameMap",
    "sanitize_function_name",
    # JSON Schema → pydantic
    "model_from_schema",
    # errors
    "SchemaError",
]
