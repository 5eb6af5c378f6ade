"""The one error the schema importer raises.

It sits in the toolfleet error tree under
:class:`~toolfleet.shared.errors.ConfigurationError` (a bad tool definition)::

    ToolfleetError
    └── ConfigurationError
        └── SchemaError        a schema or a BFCL file the importer cannot use
"""

from __future__ import annotations

from toolfleet.shared.errors import ConfigurationError

__all__ = ["SchemaError"]


class SchemaError(ConfigurationError, ValueError):
    """A parameter schema, function definition or question file cannot be imported.

    The message says where (a JSON-pointer-like path such as ``parameters.properties.x``,
    or ``file:line``) and why.
    """
