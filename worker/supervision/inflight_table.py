"""A worker process's running calls in shared memory, read by its supervisor's watchdog.

Each worker process keeps a fixed table in a file mapped into memory
(``inflight-<pid>.table`` in the process group's metrics folder, a temporary folder of
the supervisor): one row per running call holding the time (Unix epoch seconds, a
float) by which the process answers it itself, ``0.0`` for a free row. The supervisor
maps the same file and reads it every tick, also while a tool holds the process's GIL,
without a Redis command; only a row past its time sends it to Redis, for the call's
in-flight record (``<ns>:inflight:<worker id>``, what it needs to answer ``timeout``).

Row 0 is a header: ``1.0`` once the table overflowed (more running calls than rows), so
the watchdog reads Redis every tick for that process instead of trusting the table.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import threading
from pathlib import Path
from typing import Any

__all__ = ["ROWS", "InFlightTable", "TableReader", "table_path"]

#: Rows of a table (a process runs at most its slot threads' calls plus abandoned ones).
ROWS = 1024
_DOUBLE = struct.Struct("<d")


def table_path(directory: str | Path, pid: int) -> Path:
    """Where process ``pid`` keeps its table in ``directory``."""
    return Path(directory) / f"inflight-{pid}.table"


class InFlightTable:
    """The writing side, in the worker process (thread-safe).

    Args:
        path: the table's file (created, zero-filled; removed by :meth:`close`).
        rows: rows, the header included.
    """

    def __init__(self, path: Path, rows: int = ROWS) -> None:
        self.path = path
        with path.open("wb") as f:
            f.write(bytes(rows * _DOUBLE.size))
        with path.open("r+b") as f:
            self._map = mmap.mmap(f.fileno(), rows * _DOUBLE.size)
        self._lock = threading.Lock()
        self._free = list(range(rows - 1, 0, -1))
        self._rows: dict[str, int] = {}

    def put(self, call_id: str, answer_by: float) -> None:
        """Record a running call and the time (epoch seconds) by which it is answered."""
        with self._lock:
            row = self._rows.get(call_id)
            if row is None:
                if not self._free:
                    _DOUBLE.pack_into(self._map, 0, 1.0)  # overflowed: read Redis
                    return
                row = self._free.pop()
                self._rows[call_id] = row
            _DOUBLE.pack_into(self._map, row * _DOUBLE.size, answer_by)

    def move(self, call_id: str, answer_by: float) -> None:
        """Change the time of a recorded call (one that waited before it ran)."""
        with self._lock:
            row = self._rows.get(call_id)
            if row is not None:
                _DOUBLE.pack_into(self._map, row * _DOUBLE.size, answer_by)

    def clear(self, call_id: str) -> None:
        """Drop a call (answered, or ended unanswered); nothing when it is not recorded."""
        with self._lock:
            row = self._rows.pop(call_id, None)
            if row is not None:
                _DOUBLE.pack_into(self._map, row * _DOUBLE.size, 0.0)
                self._free.append(row)

    def close(self) -> None:
        """Unmap the table and remove its file."""
        with self._lock:
            self._map.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


class TableReader:
    """The reading side, in the supervisor: the tables of its processes by pid.

    Args:
        directory: the folder the processes write their tables to (``None``: none).
    """

    def __init__(self, directory: str | Path | None) -> None:
        self.directory = directory
        self._maps: dict[int, Any] = {}  # pid -> memoryview of doubles

    def earliest(self, pid: int) -> tuple[float | None, int]:
        """``(earliest answer time, running calls)`` of process ``pid``'s table.

        The time is ``None`` when nothing runs; ``(0.0, 0)`` asks for a Redis read: no
        table (yet), or one that overflowed.
        """
        values = self._values(pid)
        if values is None or values[0] != 0.0:
            return 0.0, 0
        running = [value for value in values[1:] if value]
        return (min(running) if running else None), len(running)

    def forget(self, pid: int) -> None:
        """Unmap the table of a process that exited and remove its file."""
        view = self._maps.pop(pid, None)
        if view is not None:
            view.release()
        if self.directory is not None:
            with contextlib.suppress(OSError):
                table_path(self.directory, pid).unlink()

    def forget_all_but(self, pids: set[int]) -> None:
        """Unmap the tables of every process not in ``pids``."""
        for pid in [pid for pid in self._maps if pid not in pids]:
            view = self._maps.pop(pid)
            view.release()

    def _values(self, pid: int) -> Any:
        """The doubles of ``pid``'s table (a memoryview), or None without a table."""
        view = self._maps.get(pid)
        if view is not None:
            return view
        if self.directory is None:
            return None
        path = table_path(self.directory, pid)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < 2 * _DOUBLE.size or size % _DOUBLE.size:
                return None
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        cast: Any = memoryview(mapped).cast("d")
        self._maps[pid] = cast
        return cast
