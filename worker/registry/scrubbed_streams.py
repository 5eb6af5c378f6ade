"""What the code of a worker process or a tool child writes to ``sys.stdout``/``sys.stderr``.

A tool's ``print()``, a ``sys.stderr.write`` and a traceback printed by a dying thread end
up in the worker's log. :func:`scrub_standard_streams` replaces both streams: text written
there is scrubbed of secrets (:class:`ScrubbingStream`, which holds back the text after the
last line break so that a secret written in pieces is scrubbed whole), then becomes log
records (:class:`OutputRecords`) of the logger ``toolfleet.output.stdout`` (level INFO) or
``toolfleet.output.stderr`` (WARNING), written by the worker's log handler like any other
record. So a tool's output never stands as a line of its own in the log: one ``print`` is
one record, marked as output by its logger name, whose line breaks the text format writes
as escapes and the JSON format inside ``message``; printed text that looks like a log
line, or like a JSON record, cannot pass for one. What is written to the file descriptors
directly (``os.write(2, ...)``, ``sys.__stderr__``, ``sys.stdout.buffer``, a child process's
inherited output) bypasses both.
"""

from __future__ import annotations

import io
import logging
import sys
import threading
from typing import Any, TextIO

from toolfleet.worker.registry.redaction import Redactor

__all__ = [
    "MAX_PENDING",
    "OUTPUT_LOGGER",
    "OutputRecords",
    "ScrubbingStream",
    "scrub_standard_streams",
]

#: Parent logger of what the process's code prints (``.stdout`` and ``.stderr``).
OUTPUT_LOGGER = "toolfleet.output"

#: Characters held back at most while no line break comes (past it, all but a possible
#: partial secret are written).
MAX_PENDING = 8192


class _OverStream(io.TextIOBase):
    """A text stream written over ``self.stream``: what it does not change, it delegates."""

    stream: TextIO

    def writable(self) -> bool:
        """Always true."""
        return True

    def fileno(self) -> int:
        """The underlying stream's file descriptor (what a child process inherits)."""
        return self.stream.fileno()

    def isatty(self) -> bool:
        """Whether the underlying stream is a terminal."""
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        """The underlying stream's encoding."""
        return self.stream.encoding

    @property
    def errors(self) -> str | None:  # type: ignore[override]
        """The underlying stream's error handler."""
        return self.stream.errors

    @property
    def buffer(self) -> Any:
        """The underlying binary buffer (bytes written there are neither scrubbed nor logged)."""
        return self.stream.buffer


class ScrubbingStream(_OverStream):
    """A text stream that scrubs secrets from what is written to it before passing it on.

    Complete lines are scrubbed and written (and the underlying stream flushed) at once;
    the text after the last line break waits for the rest of its line, for :meth:`flush`,
    or for :data:`MAX_PENDING` characters. When a secret's form may hold a line break, the
    last ``longest form - 1`` characters always wait. Thread-safe.

    Args:
        stream: where scrubbed text goes (e.g. the original ``sys.stderr``).
        redactor: the secrets to scrub; secrets it learns later apply from then on.
    """

    def __init__(self, stream: TextIO, redactor: Redactor) -> None:
        super().__init__()
        self.stream = stream
        self.redactor = redactor
        self._pending = ""
        self._lock = threading.Lock()

    def write(self, text: str) -> int:
        """Write ``text`` (scrubbed); returns ``len(text)``, as a text stream does."""
        if not self.redactor.secrets and not self._pending:
            self.stream.write(text)
            return len(text)
        with self._lock:
            scrubbed = self.redactor.scrub(self._pending + text)
            cut = scrubbed.rfind("\n") + 1
            hold = max(self.redactor.longest - 1, 0)
            if self.redactor.multiline:
                cut = max(min(cut, len(scrubbed) - hold), 0)
            if len(scrubbed) - cut > MAX_PENDING:
                cut = max(cut, len(scrubbed) - hold)
            self._pending = scrubbed[cut:]
            if cut > 0:
                self.stream.write(scrubbed[:cut])
                self.stream.flush()
        return len(text)

    def flush(self) -> None:
        """Write what is held back (scrubbed), then flush the underlying stream."""
        with self._lock:
            pending, self._pending = self._pending, ""
            if pending:
                self.stream.write(self.redactor.scrub(pending))
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class OutputRecords(_OverStream):
    r"""A text stream whose text becomes log records: one per write that ends a line.

    Text is held until what was written ends with a line break (``print("a\nb")`` is one
    record ``a\nb``), until :meth:`flush`, or past :data:`MAX_PENDING` characters; then it
    is logged, without its final line break, to ``logger`` at ``level``. A record logged
    while this stream is logging (a handler's own error report) is written to ``stream``
    instead, as one line with its line breaks escaped. Thread-safe.

    Args:
        stream: the original stream (its file descriptor, encoding and buffer are this
            stream's; the log handler writes there).
        logger: the logger of this stream's records.
        level: their level.
    """

    def __init__(self, stream: TextIO, logger: logging.Logger, level: int) -> None:
        super().__init__()
        self.stream = stream
        self.logger = logger
        self.level = level
        self._pending = ""
        self._lock = threading.Lock()
        self._inside = threading.local()

    def write(self, text: str) -> int:
        """Take ``text``; returns ``len(text)``, as a text stream does."""
        if getattr(self._inside, "logging", False):  # logging itself failed and reports it
            self.stream.write(text.replace("\n", "\\n").replace("\r", "\\r") + "\n")
            return len(text)
        with self._lock:
            self._pending += text
            if not self._pending.endswith("\n") and len(self._pending) <= MAX_PENDING:
                return len(text)
            done, self._pending = self._pending, ""
        self._log(done)
        return len(text)

    def flush(self) -> None:
        """Log what is held back."""
        with self._lock:
            done, self._pending = self._pending, ""
        if done:
            self._log(done)

    def _log(self, text: str) -> None:
        text = text[:-1] if text.endswith("\n") else text
        self._inside.logging = True
        try:
            self.logger.log(self.level, "%s", text)
        finally:
            self._inside.logging = False


def scrub_standard_streams(redactor: Redactor) -> None:
    """Replace ``sys.stdout`` and ``sys.stderr``: what is printed is scrubbed, then logged.

    Done once per process (see the module docstring).

    Call it after the log handlers are made: they hold the original ``sys.stderr`` (so a
    record is never written back into these streams) and scrub records themselves
    (:meth:`Redactor.log_filter`).
    """
    levels = {"stdout": logging.INFO, "stderr": logging.WARNING}
    for name, level in levels.items():
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ScrubbingStream):
            records = OutputRecords(stream, logging.getLogger(f"{OUTPUT_LOGGER}.{name}"), level)
            setattr(sys, name, ScrubbingStream(records, redactor))  # type: ignore[arg-type]
