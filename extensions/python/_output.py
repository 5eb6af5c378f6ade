"""Bounded capture of a stream: keep the first and last bytes, count the rest."""

from __future__ import annotations

__all__ = ["MARKER", "OutputBuffer"]

#: Put where bytes were left out (the child runner ``_repl.py`` writes the same marker).
MARKER = "\n[... {omitted} bytes omitted ...]\n"


class OutputBuffer:
    """Collects a byte stream, keeping at most ``limit`` bytes of it.

    The first ``limit - limit // 2`` bytes and the last ``limit // 2`` are kept; when
    more arrived, :meth:`text` joins them with :data:`MARKER` saying how many bytes were
    left out. Memory stays O(``limit``) however much is written.

    Args:
        limit: bytes to keep (at least 1).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self._head = bytearray()
        self._tail = bytearray()
        self._head_size = limit - limit // 2
        self._tail_size = limit // 2

    def write(self, data: bytes) -> None:
        """Add ``data`` to the stream."""
        self.total += len(data)
        room = self._head_size - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data and self._tail_size:
            self._tail += data[-self._tail_size :]
            del self._tail[: max(0, len(self._tail) - self._tail_size)]

    @property
    def truncated(self) -> bool:
        """True when bytes were left out."""
        return self.total > self.limit

    def text(self) -> str:
        """The kept bytes as text (invalid UTF-8 replaced), with the marker if truncated."""
        if not self.truncated:
            return (self._head + self._tail).decode("utf-8", "replace")
        omitted = self.total - len(self._head) - len(self._tail)
        head = _cut_end(bytes(self._head)).decode("utf-8", "replace")
        tail = _cut_start(bytes(self._tail)).decode("utf-8", "replace")
        return head + MARKER.format(omitted=omitted) + tail


def _cut_end(data: bytes) -> bytes:
    """Drop an incomplete UTF-8 sequence at the end (cut by the head limit)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte < 0x80:
            return data
        if byte >= 0xC0:  # a lead byte: is its sequence complete?
            need = 2 if byte < 0xE0 else 3 if byte < 0xF0 else 4
            return data if back >= need else data[:-back]
    return data


def _cut_start(data: bytes) -> bytes:
    """Drop UTF-8 continuation bytes at the start (cut by the tail limit)."""
    start = 0
    while start < min(3, len(data)) and 0x80 <= data[start] < 0xC0:
        start += 1
    return data[start:]
