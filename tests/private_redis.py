"""Private ``redis-server`` processes for tests: on a unix socket or a free loopback port."""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from conftest import unavailable
from toolfleet.shared.tenancy.enqueue import ENQUEUE_SCRIPT


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def redis_server_binary() -> str:
    """``redis-server`` (or ``valkey-server``) on PATH; skip, or fail in CI, without one."""
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if not found:
        unavailable("redis-server is not on PATH")
    return found


@dataclass
class Server:
    """A ``redis-server`` process the test started (and stops)."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self) -> None:
        stop_process(self.process)


def stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``process``, SIGKILL it after 10 s, and reap it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def start_server(folder: Path, args: Sequence[str], url: str, *, name: str = "redis") -> Server:
    """Start ``redis-server ARGS`` in ``folder`` (no persistence) and wait until ``url`` answers."""
    log_path = folder / f"{name}.log"
    argv = [redis_server_binary(), *args, "--dir", str(folder), "--logfile", str(log_path)]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    server = Server(process, url, log_path)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"{name} exited: {log_path.read_text(errors='replace')}")
        try:
            if redis.Redis.from_url(url, socket_connect_timeout=0.5).ping():
                return server
        except redis.RedisError:
            time.sleep(0.05)
    server.stop()
    raise AssertionError(f"{name} did not answer on {url}")


def start_unix_server(folder: Path, sock: Path | None = None, *, name: str = "redis") -> Server:
    """A private redis-server listening only on a unix socket: ``sock`` (a server started
    again where an earlier one listened), else one in a short temporary folder, for the
    107-byte limit of socket paths. Its logs go to ``folder``."""
    sock = sock or Path(tempfile.mkdtemp(prefix="tf-sock-")) / "redis.sock"
    args = ["--port", "0", "--unixsocket", str(sock), "--save", "", "--appendonly", "no"]
    return start_server(folder, args, f"unix://{sock}", name=name)


def start_tcp_server(folder: Path, port: int | None = None) -> Server:
    """A private redis-server on a free 127.0.0.1 port."""
    port = port or free_port()
    args = ["--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    return start_server(folder, args, f"redis://127.0.0.1:{port}/0")


def command_counts(client: redis.Redis) -> dict[str, int]:
    """Calls per command name since the last ``CONFIG RESETSTAT`` (``INFO commandstats``:
    commands run inside scripts included; the INFO and the RESETSTAT themselves excluded)."""
    stats = client.info("commandstats")
    counts = {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}
    counts.pop("info", None)
    counts.pop("config|resetstat", None)
    return counts


ENQUEUE_SHA = hashlib.sha1(ENQUEUE_SCRIPT.encode()).hexdigest()  # noqa: S324 - Redis's hash


class EnqueueRuns:
    """Counts the ``EVALSHA`` s of the enqueue script while it is open.

    ``redis-cli monitor`` in a process of its own writes every command to a file, so
    that reading them costs the client under test nothing (no GIL shared with it).
    """

    def __init__(self, url: str) -> None:
        self.url = url
        self.runs = 0
        self._out = Path(tempfile.mkstemp(prefix="monitor-", suffix=".log")[1])
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> EnqueueRuns:
        cli = shutil.which("redis-cli") or str(Path(redis_server_binary()).with_name("redis-cli"))
        with self._out.open("wb") as out:
            self._process = subprocess.Popen([cli, "-u", self.url, "monitor"], stdout=out)
        deadline = time.monotonic() + 10
        while b"OK" not in self._out.read_bytes():  # MONITOR answers OK once it watches
            assert time.monotonic() < deadline, "redis-cli monitor did not start"
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)  # the last commands reach the file
        assert self._process is not None
        self._process.terminate()
        self._process.wait(10)
        marker = f'"evalsha" "{ENQUEUE_SHA}"'.encode()
        with self._out.open("rb") as lines:
            self.runs = sum(1 for line in lines if marker in line.lower())
        self._out.unlink()


class TopLevelCommands(EnqueueRuns):
    """Counts, per command name, the commands clients sent while it is open (``MONITOR``
    in a process of its own; commands run inside scripts left out)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.counts: dict[str, int] = {}

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.5)  # the last commands reach the file
        assert self._process is not None
        self._process.terminate()
        self._process.wait(10)
        with self._out.open("rb") as lines:
            for line in lines:
                head, _, command = line.partition(b"] ")
                if b"[" not in head or head.endswith(b" lua") or not command.startswith(b'"'):
                    continue
                name = command[1:].split(b'"', 1)[0].decode().lower()
                self.counts[name] = self.counts.get(name, 0) + 1
        self._out.unlink()
