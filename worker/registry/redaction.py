"""Keep secret setting values out of replies and log records."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, quote_plus

from toolfleet.shared import codec

__all__ = ["MIN_SECRET_CHARS", "REDACTED", "Redactor", "variants"]

REDACTED = "[redacted]"

#: Shortest secret value scrubbed: a shorter one would match ordinary text (a word, a
#: number), so an extension setting declared secret with a shorter value is refused at load
#: (:func:`~toolfleet.worker.registry.extension_settings.load_settings`).
MIN_SECRET_CHARS = 4


class Redactor:
    """Replaces known secret values with ``[redacted]``, in every encoding they can take.

    A secret reaches text raw, JSON-escaped (a tool returning ``json.dumps`` output, a
    JSON log line), as a Python ``repr`` of the text or of its UTF-8 bytes (an exception
    message, ``f"{x!r}"``, ``f"{x.encode()!r}"``), backslash-escaped, URL-encoded (a URL
    with the key as a query parameter) or base64-encoded. :func:`variants` lists the
    forms searched for; they are computed once per secret, when it is added, and the
    longest form is replaced first.

    Args:
        secrets: plain secret values; values shorter than :data:`MIN_SECRET_CHARS` are
            ignored (they would match ordinary text; extension settings that short are
            refused before they get here).

    Attributes:
        secrets: the plain values known.
        longest: characters of the longest form searched for (0 with no secrets).
        multiline: some form holds a line break (a text cut at line ends may split it).
    """

    def __init__(self, secrets: set[str] | None = None) -> None:
        self.secrets: set[str] = set()
        self.longest = 0
        self.multiline = False
        self._forms: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._in_json: re.Pattern[str] | None = None
        self.add(secrets or set())

    def add(self, secrets: set[str]) -> None:
        """Learn more secret values (their forms are computed here, once)."""
        fresh = {s for s in secrets if len(s) >= MIN_SECRET_CHARS} - self.secrets
        if not fresh:
            return
        self.secrets |= fresh
        self._forms |= {form for secret in fresh for form in variants(secret)}
        self.longest = max(len(form) for form in self._forms)
        self.multiline = any("\n" in form or "\r" in form for form in self._forms)
        self._pattern = _alternation(self._forms)
        # a JSON text holds every form JSON-escaped: search those to pass clean values fast
        self._in_json = _alternation(self._forms | {_json_inner(form) for form in self._forms})

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


#: Shortest base64 text searched for: shorter runs occur by chance in any large blob.
MIN_BASE64_FORM = 8


def variants(secret: str) -> set[str]:
    r"""The forms ``secret`` takes in text.

    - raw;
    - JSON-escaped as orjson and ``json.dumps`` write it (with and without
      ``ensure_ascii``);
    - the body of ``repr(secret)``, ``ascii(secret)`` and ``repr(secret.encode())`` (the
      UTF-8 bytes: ``\xc3\xa9`` for ``é``), each in either quote style, and
      ``secret.encode("unicode_escape")``; each of these also with upper-case hex digits
      in its ``\x``/``\u``/``\U`` escapes (as C, Java and some JSON encoders write them);
    - URL-encoded by ``quote`` (with and without ``/`` safe, upper- and lower-case hex)
      and ``quote_plus``;
    - base64 (standard and URL-safe alphabets) of the UTF-8 bytes: on its own with its
      padding, and the part that is the same wherever the value sits in a longer encoded
      text (at each of the three byte offsets), when that part has at least
      :data:`MIN_BASE64_FORM` characters;
    - and each of those JSON-escaped or ``repr``'d once more (a JSON text or a message
      holding one).
    """
    data = secret.encode("utf-8", "surrogatepass")
    forms = {secret, _json_inner(secret), json.dumps(secret)[1:-1]}
    for quote_mark in ("'", '"'):
        forms.add(_quoted(secret, quote_mark, lambda c: repr(c)[1:-1]))
        forms.add(_quoted(secret, quote_mark, lambda c: ascii(c)[1:-1]))
        forms.add(_quoted(data, quote_mark, lambda b: repr(bytes([b]))[2:-1]))
    forms.add(secret.encode("unicode_escape").decode("ascii"))
    forms |= {_upper_escapes(form) for form in forms}
    for quoted in (quote(secret, safe=""), quote(secret), quote_plus(secret)):
        forms |= {quoted, _lower_hex(quoted)}
    forms |= _base64_forms(data)
    once_more = {_json_inner(form) for form in forms} | {json.dumps(form)[1:-1] for form in forms}
    for quote_mark in ("'", '"'):
        once_more |= {_quoted(form, quote_mark, lambda c: repr(c)[1:-1]) for form in forms}
    return {form for form in forms | once_more if form}


def _quoted(text: str | bytes, quote_mark: str, escape: Callable[[Any], str]) -> str:
    """The body of a Python literal of ``text`` (a str or bytes) between ``quote_mark`` s.

    ``escape`` renders one character (or byte) as ``repr`` does; a quote is escaped only
    when it is ``quote_mark``.
    """
    out = []
    for item in text:
        char = chr(item) if isinstance(item, int) else item
        if char in "'\"":
            out.append("\\" + char if char == quote_mark else char)
        else:
            out.append(escape(item))
    return "".join(out)


def _upper_escapes(form: str) -> str:
    return re.sub(
        r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})",
        lambda m: "\\" + m.group(1)[0] + m.group(1)[1:].upper(),
        form,
    )


def _base64_forms(data: bytes) -> set[str]:
    whole = base64.b64encode(data).decode("ascii")
    found = {whole}
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + data).decode("ascii")
        # characters holding a bit of the zero prefix, or of what follows the value, vary
        start, end = -(-8 * offset // 6), 8 * (offset + len(data)) // 6
        found.add(encoded[start:end])
    found |= {form.replace("+", "-").replace("/", "_") for form in found}
    return {form for form in found if len(form) >= MIN_BASE64_FORM}


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
