"""Scrub what the code of a worker process or a tool child writes to ``sys.stdout``/``sys.stderr``.

A tool's ``print()``, a ``sys.stderr.write`` and a traceback printed by a dying thread end
up in the worker's log. :func:`scrub_standard_streams` replaces both streams with a
:class:`ScrubbingStream`, which holds back the text after the last line break (a secret
written in pieces is scrubbed whole) and writes complete lines, scrubbed, at once; with
no secret known it passes text through untouched. What is written to the file descriptors
directly (``os.write(2, ...)``, ``sys.__stderr__``, ``sys.stdout.buffer``, a child
process's inherited output) bypasses it.
"""

from __future__ import annotations

import io
import sys
import threading
from typing import Any, TextIO

from toolfleet.worker.registry.redaction import Redactor

__all__ = ["MAX_PENDING", "ScrubbingStream", "scrub_standard_streams"]

#: Characters held back at most while no line break comes (past it, all but a possible
#: partial secret are written).
MAX_PENDING = 8192


class ScrubbingStream(io.TextIOBase):
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
        """The underlying binary buffer (bytes written there are not scrubbed)."""
        return self.stream.buffer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def scrub_standard_streams(redactor: Redactor) -> None:
    """Replace ``sys.stdout`` and ``sys.stderr`` by :class:`ScrubbingStream` s (once).

    Call it after the log handlers are made: they hold the original ``sys.stderr`` and
    scrub records themselves (:meth:`Redactor.log_filter`), so log lines are not scrubbed
    twice.
    """
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, ScrubbingStream):
            setattr(sys, name, ScrubbingStream(stream, redactor))
