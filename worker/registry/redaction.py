"""Keep secret setting values out of replies and log records."""

from __future__ import annotations

import json
import logging
import re
from typing import Any
from urllib.parse import quote, quote_plus

from toolfleet.shared import codec

__all__ = ["REDACTED", "Redactor", "variants"]

REDACTED = "[redacted]"


class Redactor:
    """Replaces known secret values with ``[redacted]``, in every encoding they can take.

    A secret reaches text raw, JSON-escaped (a tool returning ``json.dumps`` output, a
    JSON log line), as a Python ``repr`` (an exception message, ``f"{x!r}"``) or
    URL-encoded (a URL with the key as a query parameter). :func:`variants` lists the
    forms searched for; the longest form is replaced first.

    Args:
        secrets: plain secret values; values shorter than 4 characters are ignored
            (they would match ordinary text).
    """

    def __init__(self, secrets: set[str] | None = None) -> None:
        self.secrets: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._in_json: re.Pattern[str] | None = None
        self.add(secrets or set())

    def add(self, secrets: set[str]) -> None:
        """Learn more secret values."""
        fresh = {s for s in secrets if len(s) >= 4} - self.secrets
        if not fresh:
            return
        self.secrets |= fresh
        forms = {form for secret in self.secrets for form in variants(secret)}
        self._pattern = _alternation(forms)
        # a JSON text holds every form JSON-escaped: search those to pass clean values fast
        self._in_json = _alternation(forms | {_json_inner(form) for form in forms})

    def scrub(self, text: str) -> str:
        """``text`` with every form of every secret value replaced."""
        if self._pattern is None:
            return text
        return self._pattern.sub(REDACTED, text)

    def scrub_json(self, value: Any) -> Any:
        """A JSON value with every secret inside its strings (and keys) replaced."""
        if self._in_json is None:
            return value
        if self._in_json.search(codec.dumps_str(value)) is None:
            return value
        return self._scrub_value(value)

    def _scrub_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.scrub(value)
        if isinstance(value, dict):
            return {self.scrub(str(k)): self._scrub_value(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [self._scrub_value(item) for item in value]
        return value

    def log_filter(self) -> logging.Filter:
        """A filter for log handlers that scrubs message, arguments and traceback text."""
        return _ScrubFilter(self)


def variants(secret: str) -> set[str]:
    """The forms ``secret`` takes in text: raw, JSON-escaped, repr, URL-encoded.

    JSON-escaped as orjson and ``json.dumps`` write it (with and without
    ``ensure_ascii``); ``repr``/``ascii`` without their quotes (in either quote style);
    URL-encoded by ``quote`` (with and without ``/`` safe, upper- and lower-case hex) and
    ``quote_plus``; and each of those JSON-escaped once more (a JSON text holding one).
    """
    forms = {secret, _json_inner(secret), json.dumps(secret)[1:-1], ascii(secret)[1:-1]}
    forms |= {repr(secret)[1:-1], repr(secret + "'")[1:-3], repr(secret + '"')[1:-3]}
    for quoted in (quote(secret, safe=""), quote(secret), quote_plus(secret)):
        forms |= {quoted, _lower_hex(quoted)}
    forms |= {_json_inner(form) for form in forms} | {json.dumps(form)[1:-1] for form in forms}
    return {form for form in forms if form}


def _json_inner(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def _lower_hex(quoted: str) -> str:
    return re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quoted)


def _alternation(forms: set[str]) -> re.Pattern[str]:
    ordered = sorted(forms, key=lambda form: (-len(form), form))
    return re.compile("|".join(re.escape(form) for form in ordered))


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
