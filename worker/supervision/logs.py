r"""Worker logging: text or JSON lines, with the current call's id, function and trace.

``TOOLFLEET_LOG_FORMAT=json`` writes one JSON object per record (``timestamp``, RFC 3339 in
UTC with microseconds; ``level``, ``logger``, ``message``, ``worker``, and while a call is
handled ``call_id``, ``function``, ``traceparent``, ``trace_id`` and ``span_id`` (the
call's CONSUMER span, see :mod:`toolfleet.shared.tracing`, or its ``traceparent``); plus
``status``, ``queued_s``, ``run_s`` on the per-call line). Secret setting values are
scrubbed from every record (:mod:`.redaction`), warnings included. A message is cut at
:data:`MAX_MESSAGE_CHARS` characters: a record quoting a raw message (Dramatiq's own
"Failed to process message ..." line repeats its arguments) stays one short line however
large the request was.

The text format writes one line per record: a message's control characters (``\n``,
``\r``, U+2028...), which may come from the wire (raw arguments, ids, error text), are
written as escapes (:func:`escape_controls`), so a value cannot forge a line of its own. A
traceback still follows on its own lines.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from toolfleet.worker.registry.redaction import Redactor

__all__ = [
    "CALL_FIELDS",
    "MAX_MESSAGE_CHARS",
    "call_scope",
    "configure_logging",
    "escape_controls",
]

#: Longest message of a log record, characters (longer ones are cut, saying how much).
MAX_MESSAGE_CHARS = 4000

#: Record attributes a call scope sets (and the JSON formatter writes when present).
CALL_FIELDS = (
    "call_id",
    "function",
    "traceparent",
    "trace_id",
    "span_id",
    "status",
    "queued_s",
    "run_s",
)

#: What can end or rewrite a line of text: C0 and C1 controls, DEL, U+2028 and U+2029
#: (the characters ``str.splitlines`` and terminals break or act on).
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")

_call: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "toolfleet_call", default=None
)


class _CallScope:
    """The context manager :func:`call_scope` returns (a class: no generator per call)."""

    __slots__ = ("_fields", "_token")

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields
        self._token: contextvars.Token[dict[str, Any] | None] | None = None

    def __enter__(self) -> None:
        outer = _call.get()
        self._token = _call.set({**outer, **self._fields} if outer else self._fields)

    def __exit__(self, *exc: object) -> None:
        if self._token is not None:
            _call.reset(self._token)
            self._token = None


def call_scope(**fields: Any) -> AbstractContextManager[None]:
    """Attach ``fields`` (call_id, function, traceparent, ...) to records logged inside.

    A field whose value is ``None`` is left out.
    """
    return _CallScope({k: v for k, v in fields.items() if v is not None})


class _CallFilter(logging.Filter):
    def __init__(self, worker: str) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        record.worker = self.worker
        for key, value in (_call.get() or {}).items():
            if not hasattr(record, key):
                setattr(record, key, value)
        message = record.getMessage()  # formatted once: the formatter reuses it
        if len(message) > MAX_MESSAGE_CHARS:
            cut = len(message) - MAX_MESSAGE_CHARS
            message = f"{message[:MAX_MESSAGE_CHARS]}... [{cut} more characters]"
        record.msg, record.args = message, None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        """Render ``record`` as a JSON line."""
        data: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="microseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "worker": getattr(record, "worker", None),
        }
        for key in CALL_FIELDS:
            value = getattr(record, key, None)
            if value is not None:
                data[key] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            data["exception"] = record.exc_text
        return json.dumps(data, default=str)


def escape_controls(text: str) -> str:
    r"""``text`` with each control character written as its Python escape.

    ``"a\nb"`` becomes ``"a\\nb"`` (a backslash and ``n``); likewise ``\r``, ``\t``,
    ``\x1b``, ``\u2028``. Printable text is returned as it is.
    """
    if text.isprintable():
        return text
    return _CONTROLS.sub(lambda found: repr(found.group())[1:-1], text)


class TextFormatter(logging.Formatter):
    """``logging.Formatter`` whose record line is one line (:func:`escape_controls`)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        """The record's line, its control characters escaped (a traceback is added after)."""
        return escape_controls(super().formatMessage(record))


def configure_logging(level: str, fmt: str, worker: str, redactor: Redactor) -> None:
    """Set up the root logger of a worker process (stderr; text or ``json``).

    ``warnings.warn`` goes through it too (``logging.captureWarnings``, logger
    ``py.warnings``), so a warning's text is scrubbed like any record.
    """
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(
            TextFormatter(f"%(asctime)s %(levelname)s [{worker}] %(name)s: %(message)s")
        )
    handler.addFilter(_CallFilter(worker))
    handler.addFilter(redactor.log_filter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.captureWarnings(True)
