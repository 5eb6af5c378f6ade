"""Keep secret setting values out of replies and log records."""

from __future__ import annotations

import logging
from typing import Any

from toolfleet.shared import codec

__all__ = ["REDACTED", "Redactor"]

REDACTED = "[redacted]"


class Redactor:
    """Replaces known secret values with ``[redacted]``.

    Args:
        secrets: plain secret values; values shorter than 4 characters are ignored
            (they would match ordinary text).
    """

    def __init__(self, secrets: set[str] | None = None) -> None:
        self.secrets: set[str] = set()
        self.add(secrets or set())

    def add(self, secrets: set[str]) -> None:
        """Learn more secret values."""
        self.secrets |= {s for s in secrets if len(s) >= 4}

    def scrub(self, text: str) -> str:
        """``text`` with every secret value replaced."""
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, REDACTED)
        return text

    def scrub_json(self, value: Any) -> Any:
        """A JSON value with every secret inside its strings (and keys) replaced."""
        if not self.secrets:
            return value
        text = codec.dumps_str(value)
        if not any(secret in text for secret in self.secrets):
            return value
        return codec.loads(self.scrub(text))

    def log_filter(self) -> logging.Filter:
        """A filter for log handlers that scrubs message, arguments and traceback text."""
        return _ScrubFilter(self)


class _ScrubFilter(logging.Filter):
    def __init__(self, redactor: Redactor) -> None:
        super().__init__()
        self.redactor = redactor
        self._formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.redactor.secrets:
            return True
        record.msg = self.redactor.scrub(record.getMessage())
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redactor.scrub(record.exc_text)
            record.exc_info = None
        if record.stack_info:
            record.stack_info = self.redactor.scrub(record.stack_info)
        return True
