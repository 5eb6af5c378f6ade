"""Read the function lists out of a BFCL question file.

BFCL question files are JSON Lines despite their ``.json`` suffix (``SOURCE.md``,
"Format"): one entry per line, ``{"id", "question", "function"}``. Two layouts:

- v3 (``BFCL_v3_*.json``): ``function`` is a list of definitions;
- v1 (``gorilla_openfunctions_v1_test_executable_*.json``): ``function`` is a single
  definition in simple/parallel files and a list in the multiple ones.

The standard library's :mod:`json` reads the lines: it keeps integers of any size exact.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from toolfleet.shared.schema.errors import SchemaError

__all__ = ["RawFunction", "read_question_file"]

#: ``(line number (1-based), entry id, the definition as in the file)``
RawFunction = tuple[int, str, dict[str, Any]]


def read_question_file(path: str | os.PathLike[str]) -> Iterator[RawFunction]:
    """Yield every function definition of a BFCL question file, in file order.

    Args:
        path: a BFCL question file (JSON Lines, v3 or v1 layout).

    Yields:
        ``(line, entry_id, definition)``; an entry without ``id`` gets ``"line<N>"``.

    Raises:
        SchemaError: a line is not JSON, not an object, or has no usable ``function``.
        OSError: the file cannot be read.
    """
    where = Path(path)
    with where.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SchemaError(f"{where}:{number}: not JSON: {exc}") from None
            if not isinstance(entry, dict):
                raise SchemaError(f"{where}:{number}: an entry must be a JSON object")
            entry_id = str(entry.get("id", f"line{number}"))
            for function in _functions(entry, f"{where}:{number}"):
                yield number, entry_id, function


def _functions(entry: dict[str, Any], where: str) -> list[dict[str, Any]]:
    functions = entry.get("function")
    if isinstance(functions, dict):
        functions = [functions]
    if not isinstance(functions, list) or not all(isinstance(f, dict) for f in functions):
        raise SchemaError(f"{where}: 'function' must be an object or a list of objects")
    return functions
