"""The CLI with Redis unreachable: one-line errors, a worker that waits, riding out blips."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
import redis

from conftest import TESTS, default_sigint, toolfleet_command
from private_redis import Server, free_port, start_server
from toolfleet.shared.naming import events_key

PASSWORD = "s3cret-pw"

#: every command that talks to Redis, with the arguments it needs
COMMANDS = [
    ["tools"],
    ["top", "--once"],
    ["top"],
    ["events"],
    ["switch", "list"],
    ["switch", "on", "ext_fleet_test_add"],
    ["switch", "off", "ext_fleet_test_add"],
    ["switch", "delete", "ext_fleet_test_add"],
    ["limits", "list"],
    ["limits", "set", "acme", "--in-flight", "3"],
    ["limits", "delete", "acme"],
    ["extensions", "check", "--no-entry-points"],
    ["call", "ext_fleet_test_add", '{"a": 1, "b": 2}'],
    ["replay", str(TESTS.parent / "worker" / "devtools" / "samples" / "demo.jsonl")],
    ["demo"],
]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    return {**env, "PYTHONPATH": str(TESTS), "TOOLFLEET_METRICS_PORT": "0", **extra}


def _run(args: list[str], timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [toolfleet_command(), *args],
        capture_output=True,
        text=True,
        env=_env(**env),
        timeout=timeout,
        check=False,
    )


def _lines(out: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a[:2]))
def test_command_reports_unreachable_redis_in_at_most_three_lines(args: list[str]) -> None:
    """With nothing listening at the URL, each command prints at most 3 lines saying what
    failed, the URL without its password and what to do, exits non-zero, no traceback."""
    url = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    out = _run([*args, "--redis-url", url], TOOLFLEET_NAMESPACE=f"tfout-{uuid.uuid4().hex[:6]}")
    text = out.stdout + out.stderr
    assert out.returncode != 0, text
    assert 1 <= len(_lines(out)) <= 3, text
    assert "Traceback" not in text
    assert PASSWORD not in text
    assert "cannot reach Redis at redis://:***@127.0.0.1:" in text
    assert "--redis-url" in text  # what to do


def test_url_without_a_scheme_is_one_line() -> None:
    """A Redis URL without a scheme is refused in at most 3 lines naming the fix."""
    out = _run(["tools"], TOOLFLEET_REDIS_URL="127.0.0.1:6379")
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert 1 <= len(_lines(out)) <= 3, text
    assert "Traceback" not in text
    assert "'127.0.0.1:6379' is not a Redis URL: use redis://" in text


#: URLs with a scheme redis-py knows that it still cannot use: each part is refused by its
#: URL parser (port not a number, out of range, a broken IPv6 host, a bad query value)
MALFORMED_URLS = [
    f"redis://:{PASSWORD}@127.0.0.1:notaport/0",
    f"redis://:{PASSWORD}@127.0.0.1:99999/0",
    f"redis://:{PASSWORD}@[::1/0",
    f"redis://:{PASSWORD}@127.0.0.1:6379/0?socket_timeout=soon",
    f"redis+cluster://:{PASSWORD}@127.0.0.1:7000?socket_timeout=soon",
]


@pytest.mark.parametrize("args", [*COMMANDS, ["worker"]], ids=lambda a: " ".join(a[:2]))
def test_malformed_url_is_one_line_for_every_command_and_the_worker(args: list[str]) -> None:
    """A URL redis-py's parser refuses is one line (no traceback, no password) for every
    command that talks to Redis, the worker included, and each kind of malformation."""
    for url in MALFORMED_URLS:
        out = _run([*args, "--redis-url", url], timeout=60)
        text = out.stdout + out.stderr
        assert out.returncode != 0, text
        (error, *hint) = _lines(out)  # the error in one line, then the CLI's usual hint
        assert "is not a usable Redis URL" in error and len(hint) <= 1, text
        assert "Traceback" not in text and PASSWORD not in text, text


def test_debug_shows_the_traceback() -> None:
    """--debug (before or after the subcommand) adds the traceback to the one-line error."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    for args in (
        ["--debug", "tools", "--redis-url", url],
        ["tools", "--redis-url", url, "--debug"],
    ):
        out = _run(args)
        assert out.returncode != 0
        assert "Traceback" in out.stderr and "cannot reach Redis" in out.stderr


class PrivateRedis:
    """A password-protected redis-server on a private port, stopped and started at will."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://:{PASSWORD}@127.0.0.1:{self.port}/0"
        self.server: Server | None = None

    def start(self) -> None:
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--requirepass", PASSWORD]
        self.server = start_server(
            self.folder, [*args, "--save", "", "--appendonly", "no"], self.url
        )

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server on a private port with a password, stopped at the end."""
    server = PrivateRedis(tmp_path)
    yield server
    server.stop()


def _worker(url: str, tmp_path: Path, grace_s: float = 5.0) -> tuple[subprocess.Popen[bytes], Path]:
    """``toolfleet worker`` with the global options after the subcommand, output to a log."""
    log = tmp_path / "worker.log"
    argv = [toolfleet_command(), "worker", "-p", "1", "-t", "2"]
    argv += ["--extension", "fleet_tools:extension", "--redis-url", url]
    argv += ["--namespace", f"tfout-{uuid.uuid4().hex[:6]}"]
    env = _env(
        TOOLFLEET_HEARTBEAT_INTERVAL_S="0.5",
        TOOLFLEET_WORKER_TTL_S="3",
        TOOLFLEET_SHUTDOWN_GRACE_S=str(grace_s),
        TOOLFLEET_HEALTH_DIR=str(tmp_path / "health"),
    )
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return process, log


def _wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _namespace_of(argv: list[str]) -> str:
    return argv[argv.index("--namespace") + 1]


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_worker_waits_for_redis_then_serves(private_redis: PrivateRedis, tmp_path: Path) -> None:
    """A worker started with Redis down logs one line per attempt, no traceback, and serves
    once a redis-server starts at its URL."""
    from toolfleet.producer import ToolClient

    process, log = _worker(private_redis.url, tmp_path)
    try:
        _wait_for(lambda: log.read_text().count("unreachable") >= 3, 60, "3 attempts")
        text = log.read_text()
        attempts = [line for line in text.splitlines() if "unreachable" in line]
        assert all("redis://:***@127.0.0.1:" in line for line in attempts), text
        assert all(f"attempt {n}," in line for n, line in enumerate(attempts, 1)), text
        assert "Traceback" not in text and PASSWORD not in text
        assert process.poll() is None
        private_redis.start()
        namespace = _namespace_of(process.args)  # type: ignore[arg-type]
        with ToolClient(private_redis.url, namespace=namespace) as client:
            deadline = time.monotonic() + 60
            result = client.call("ext_fleet_test_add", {"a": 2, "b": 3}, timeout_s=5)
            while result.status.value != "ok" and time.monotonic() < deadline:
                time.sleep(0.2)
                result = client.call("ext_fleet_test_add", {"a": 2, "b": 3}, timeout_s=5)
        assert result.status.value == "ok" and result.content == 5, result
        assert "Traceback" not in log.read_text()
    finally:
        _stop(process)


def _probe(port: int, path: str) -> tuple[int, str]:
    """Status code and body of ``GET path`` on the supervisor's HTTP server (0: no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()
    except OSError:
        return 0, ""


def test_redis_down_at_start_is_live_not_ready(private_redis: PrivateRedis, tmp_path: Path) -> None:
    """A worker started while its Redis is down answers /livez 200 (and `health --live` 0) but
    /readyz 503 (`health --ready` 1) for longer than the stale window, and is ready once Redis
    answers."""
    port, health = free_port(), tmp_path / "health"
    env = _env(TOOLFLEET_METRICS_PORT=str(port), TOOLFLEET_HEALTH_DIR=str(health),
               TOOLFLEET_HEALTH_STALE_S="2", TOOLFLEET_HEARTBEAT_INTERVAL_S="0.5")  # fmt: skip
    argv = [toolfleet_command(), "worker", "-p", "1", "-t", "2", "--extension",
            "fleet_tools:extension", "--redis-url", private_redis.url,
            "--namespace", f"tfout-{uuid.uuid4().hex[:6]}"]  # fmt: skip
    log = tmp_path / "worker.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    probe_env = {"TOOLFLEET_HEALTH_DIR": str(health), "TOOLFLEET_HEALTH_STALE_S": "2"}
    try:
        _wait_for(lambda: _probe(port, "/livez")[0] != 0, 60, "the probe server")
        _wait_for(lambda: log.read_text().count("unreachable") >= 2, 60, "2 attempts")
        samples = []
        until = time.monotonic() + 4.0  # twice the stale window
        while time.monotonic() < until:
            samples.append((_probe(port, "/livez")[0], _probe(port, "/readyz")[0]))
            time.sleep(0.25)
        assert set(samples) == {(200, 503)}, (samples, log.read_text())
        live = _run(["health", "--live"], timeout=30, **probe_env)
        ready = _run(["health", "--ready", "--redis-url", private_redis.url], timeout=30,
                     **probe_env)  # fmt: skip
        assert (live.returncode, ready.returncode) == (0, 1), (live, ready)
        private_redis.start()
        # both at one reading: on a loaded machine the 2 s stale window can still lapse for a
        # beat while the worker process starts serving
        _wait_for(
            lambda: (_probe(port, "/livez")[0], _probe(port, "/readyz")[0]) == (200, 200),
            60,
            "/livez and /readyz 200 with Redis up",
        )
    finally:
        _stop(process)


def test_sigterm_while_waiting_for_redis_exits_at_once(tmp_path: Path) -> None:
    """SIGTERM to a worker still waiting for Redis ends it promptly, status 0, no traceback,
    no heartbeat file."""
    process, log = _worker(f"redis://127.0.0.1:{free_port()}/0", tmp_path)
    try:
        _wait_for(lambda: "unreachable" in log.read_text(), 60, "a first attempt")
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - started < 5.0
        assert "Traceback" not in log.read_text()
        assert not list((tmp_path / "health").glob("*.json"))
    finally:
        _stop(process)


def test_sigterm_with_redis_gone_exits_within_grace_without_heartbeat_files(
    private_redis: PrivateRedis, tmp_path: Path
) -> None:
    """A serving worker whose Redis goes away drains on SIGTERM within the shutdown grace,
    logs no traceback and leaves no heartbeat file."""
    grace_s = 10.0
    private_redis.start()
    process, log = _worker(private_redis.url, tmp_path, grace_s=grace_s)
    health = tmp_path / "health"
    try:
        _wait_for(lambda: "serving" in log.read_text(), 90, "the worker to serve")
        _wait_for(lambda: list(health.glob("*.json")), 30, "a heartbeat file")
        private_redis.stop()
        time.sleep(1.0)  # the worker notices: consumers and heartbeats fail
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=grace_s + 20) == 0
        elapsed = time.monotonic() - started
        text = log.read_text()
        assert elapsed < grace_s, f"took {elapsed:.1f} s\n{text}"
        assert "Traceback" not in text, text
        assert not list(health.glob("*.json"))
    finally:
        _stop(process)


def _spawn(args: list[str], url: str, namespace: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [toolfleet_command(), *args, "--redis-url", url, "--namespace", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
        preexec_fn=default_sigint,
    )


class Drained:
    """A reader thread that keeps a pipe of a child drained into ``text``."""

    def __init__(self, pipe: IO[str] | None) -> None:
        assert pipe is not None
        self.parts: list[str] = []
        self.thread = threading.Thread(target=lambda: self.parts.extend(pipe), daemon=True)
        self.thread.start()

    @property
    def text(self) -> str:
        return "".join(list(self.parts))


def test_top_and_events_ride_out_a_redis_restart(private_redis: PrivateRedis) -> None:
    """`top` and `events` keep running while their Redis restarts, say so once on stderr,
    and recover: events posted after the restart are printed."""
    private_redis.start()
    namespace = f"tfout-{uuid.uuid4().hex[:6]}"
    events = _spawn(["events", "--count", "1"], private_redis.url, namespace)
    top = _spawn(["top", "--interval", "0.2"], private_redis.url, namespace)
    Drained(top.stdout)  # its frames: a pipe nobody reads would stop it at 64 KiB
    top_err = Drained(top.stderr)
    try:
        watcher = redis.Redis.from_url(private_redis.url)
        _wait_for(lambda: len(watcher.client_list()) >= 3, 60, "events and top to connect")
        watcher.close()
        time.sleep(0.5)
        assert events.poll() is None and top.poll() is None
        private_redis.stop()
        time.sleep(2.0)
        assert events.poll() is None, events.communicate()
        assert top.poll() is None, top_err.text
        private_redis.start()
        client = redis.Redis.from_url(private_redis.url)
        deadline = time.monotonic() + 30
        while events.poll() is None and time.monotonic() < deadline:
            client.xadd(events_key(namespace), {"event": b'{"kind": "after-restart"}'})
            time.sleep(0.2)
        client.close()
        out, err = events.communicate(timeout=10)
        assert events.returncode == 0, err
        assert '"after-restart"' in out
        assert "unreachable" in err and "is back" in err and "Traceback" not in err
        _wait_for(lambda: "is back" in top_err.text, 60, "top to see Redis back")
        assert top.poll() is None
        top.send_signal(signal.SIGINT)
        assert top.wait(timeout=10) == 0, top_err.text
        top_err.thread.join(timeout=10)
        assert "unreachable" in top_err.text and "Traceback" not in top_err.text
    finally:
        for process in (events, top):
            if process.poll() is None:
                process.kill()
                process.wait()


def test_ctrl_c_while_the_demo_stops_is_quiet() -> None:
    """Ctrl-C in the demo's last second (its fleet stopping) prints no traceback and leaves
    no worker or redis-server behind."""
    namespace = f"tfdemo-{uuid.uuid4().hex[:8]}"
    process = subprocess.Popen(
        [toolfleet_command(), "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(TOOLFLEET_NAMESPACE=namespace),
        preexec_fn=default_sigint,
    )
    assert process.stdout is not None
    seen: list[str] = []
    try:
        for line in process.stdout:
            seen.append(line)
            if line.startswith("Next: "):  # the report is over: the fleet is being stopped
                process.send_signal(signal.SIGINT)
                break
        seen.append(process.communicate(timeout=120)[0])
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    text = "".join(seen)
    assert "Next: " in text, text
    assert "Traceback" not in text, text
    pgrep = ["pgrep", "-f", namespace]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and subprocess.run(pgrep, check=False).returncode == 0:
        time.sleep(0.1)
    assert subprocess.run(pgrep, check=False, capture_output=True).stdout == b""


def test_replay_stops_with_one_line_when_redis_goes_away(
    private_redis: PrivateRedis, tmp_path: Path
) -> None:
    """A replay whose Redis goes away mid-run stops with one line saying so instead of a
    mismatch for every call left."""
    private_redis.start()
    process, log = _worker(private_redis.url, tmp_path)
    namespace = _namespace_of(process.args)  # type: ignore[arg-type]
    calls = tmp_path / "calls.jsonl"
    row = '{"function": "ext_fleet_test_sleep", "arguments": {"seconds": 0.5}}\n'
    calls.write_text(row * 12)
    watcher = redis.Redis.from_url(private_redis.url)
    try:
        _wait_for(lambda: "serving" in log.read_text(), 90, "the worker to serve")
        replay = subprocess.Popen(
            [toolfleet_command(), "replay", str(calls), "--timeout", "5"]
            + ["--redis-url", private_redis.url, "--namespace", namespace],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        answered = events_key(namespace)  # the worker logs each answer there
        _wait_for(lambda: watcher.exists(answered), 60, "a first answer")
        watcher.close()
        private_redis.stop()
        out, err = replay.communicate(timeout=60)
        text = out + err
        assert replay.returncode == 2, text
        assert len([line for line in text.splitlines() if line.strip()]) <= 3, text
        assert "cannot reach Redis at redis://:***@127.0.0.1:" in text
        assert "mismatch" not in text and "Traceback" not in text and PASSWORD not in text
    finally:
        watcher.close()
        _stop(process)


def test_wrong_password_is_one_line_without_the_password(private_redis: PrivateRedis) -> None:
    """A Redis that refuses the URL's password is reported in at most 3 lines that name the
    fix and do not repeat the password."""
    private_redis.start()
    wrong = private_redis.url.replace(PASSWORD, "not-the-pw")
    out = _run(["switch", "list", "--redis-url", wrong])
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    assert 1 <= len(_lines(out)) <= 3, text
    assert "refused the credentials" in text and "password" in text
    assert "not-the-pw" not in text and "Traceback" not in text
