"""MCP servers as extensions, against servers nobody here wrote and one built with the SDK.

A real fleet (the CLI, real Redis) loads by manifest: the reference ``mcp-server-time`` from
PyPI, ``tests/mcp_servers/probe_server.py`` (built with the official SDK) over stdio and
over Streamable HTTP, and three broken servers.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
import zoneinfo
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from conftest import LATE_S, TESTS, Fleet, start_fleet, toolfleet_command
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared import Status
from toolfleet.shared.naming import mcp_servers_key

pytest.importorskip("mcp", reason="the MCP SDK (toolfleet[mcp]) is not installed")

PROBE = TESTS / "mcp_servers" / "probe_server.py"
TIME_SERVER = Path(sys.executable).parent / "mcp-server-time"
SECRET = f"tok-{uuid.uuid4().hex}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _manifest(folder: Path, slug: str, body: str) -> None:
    (folder / slug).mkdir(parents=True)
    (folder / slug / "extension.toml").write_text(
        f'slug = "{slug}"\nversion = "1.0.0"\n' + body, encoding="utf-8"
    )


def _probe_args(marks: Path, *extra: str) -> str:
    return json.dumps([str(PROBE), "--marks", str(marks), *extra])


def _wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _proc_state(pid)


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return "Z"


def _mcp_reports(fleet: Fleet) -> dict[str, Any]:
    client = redis.Redis.from_url(fleet.redis_url)
    try:
        raw = client.hgetall(mcp_servers_key(fleet.namespace))
    finally:
        client.close()
    return {k.decode(): json.loads(v) for k, v in raw.items()}


@pytest.fixture(scope="module")
def http_probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """The probe server over Streamable HTTP on a free loopback port."""
    marks = tmp_path_factory.mktemp("http-marks")
    port = _free_port()
    process = subprocess.Popen(
        [sys.executable, str(PROBE), "--marks", str(marks), "--http", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    try:
        _wait_for(listening, 30, "the HTTP probe server listens")
        yield port, marks
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def mcp_fleet(
    redis_url: str,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
    http_probe: tuple[int, Path],
) -> Iterator[Fleet]:
    """Two worker processes with the time server, the probe (stdio and HTTP), three broken
    MCP servers and the usual test extension; /metrics on a free port."""
    tmp = tmp_path_factory.mktemp("mcp")
    folder, marks = tmp / "extensions", tmp / "marks"
    _manifest(
        folder,
        "time",
        f'description = "The reference time server"\n[mcp]\ncommand = "{TIME_SERVER.name}"\n',
    )
    _manifest(
        folder,
        "probe",
        "timeout = 10.0\n"
        f"[mcp]\ncommand = {json.dumps(sys.executable)}\nargs = {_probe_args(marks)}\n"
        'env = { PROBE_TOKEN = "{settings.token}" }\n'
        "[tools.slow]\ntimeout = 1.0\n"
        '[[settings]]\nname = "token"\nsecret = true\n',
    )
    port, _ = http_probe
    _manifest(
        folder,
        "remote",
        f'[mcp]\nurl = "http://127.0.0.1:{port}/mcp"\n'
        'headers = { Authorization = "Bearer {settings.key}" }\n'
        '[[settings]]\nname = "key"\nsecret = true\ndefault = "http-key"\n',
    )
    _manifest(folder, "missing", '[mcp]\ncommand = "no-such-mcp-server-7f3a"\n')
    _manifest(
        folder,
        "crashing",
        f"[mcp]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {_probe_args(marks, '--mode', 'crash')}\n",
    )
    _manifest(
        folder,
        "silent",
        f"[mcp]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = {_probe_args(marks, '--mode', 'hang')}\nstart_timeout = 1.0\n",
    )
    metrics_port = _free_port()
    fleet = start_fleet(
        redis_url,
        f"{namespace}-mcp-{uuid.uuid4().hex[:6]}",
        tmp / "worker.log",
        processes=2,
        env={
            "TOOLFLEET_EXTENSION_PATHS": str(folder),
            "TOOLFLEET_EXT_PROBE_TOKEN": SECRET,
            "PROBE_WORKER_ONLY": "must-not-reach-the-server",
            "TOOLFLEET_MAX_RESULT_BYTES": "100000",
            "TOOLFLEET_METRICS_PORT": str(metrics_port),
            "PROMETHEUS_MULTIPROC_DIR": str(tmp / "metrics"),
        },
    )
    fleet.marks = marks  # type: ignore[attr-defined]
    fleet.folder = folder  # type: ignore[attr-defined]
    fleet.metrics_port = metrics_port  # type: ignore[attr-defined]
    yield fleet
    fleet.stop()


@pytest.fixture
def mcp_client(mcp_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(mcp_fleet.redis_url, namespace=mcp_fleet.namespace) as client:
        yield client


# -- the reference server ---------------------------------------------------------------


def test_time_server_answers_through_the_fleet(mcp_client: ToolClient) -> None:
    """get_current_time and convert_time of mcp-server-time answer through ToolClient with the
    server's structured values."""
    now = mcp_client.call("ext_time_get_current_time", {"timezone": "Europe/Paris"}, timeout_s=20)
    assert now.status is Status.OK, now.content
    assert now.content["timezone"] == "Europe/Paris"
    stamp = dt.datetime.fromisoformat(now.content["datetime"])
    paris = dt.datetime.now(zoneinfo.ZoneInfo("Europe/Paris"))
    assert stamp.utcoffset() == paris.utcoffset()
    assert abs((stamp - paris).total_seconds()) < 60
    converted = mcp_client.call(
        "ext_time_convert_time",
        {"source_timezone": "Europe/Paris", "time": "12:00", "target_timezone": "Asia/Tokyo"},
        timeout_s=20,
    )
    assert converted.status is Status.OK, converted.content
    today = dt.datetime.now(zoneinfo.ZoneInfo("Europe/Paris")).date()
    noon = dt.datetime.combine(today, dt.time(12), zoneinfo.ZoneInfo("Europe/Paris"))
    tokyo = noon.astimezone(zoneinfo.ZoneInfo("Asia/Tokyo"))
    target = dt.datetime.fromisoformat(converted.content["target"]["datetime"])
    assert (target.hour, target.minute) == (tokyo.hour, tokyo.minute)


def test_time_server_bad_timezone_is_tool_error_with_the_server_text(
    mcp_client: ToolClient,
) -> None:
    """An unknown timezone comes back tool_error carrying the server's own message."""
    result = mcp_client.call("ext_time_get_current_time", {"timezone": "Mars/Olympus"})
    assert result.status is Status.TOOL_ERROR
    assert "Invalid timezone" in result.content["error"]
    assert "Mars/Olympus" in result.content["error"]


def test_invalid_arguments_are_refused_before_the_server(
    mcp_client: ToolClient, mcp_fleet: Fleet
) -> None:
    """Arguments that do not match a tool's inputSchema come back invalid_arguments, and the
    server never sees the call; valid ones reach it."""
    missing = mcp_client.call("ext_time_get_current_time", {})
    assert missing.status is Status.INVALID_ARGUMENTS
    assert "timezone" in missing.content["error"]
    marks: Path = mcp_fleet.marks  # type: ignore[attr-defined]
    refused = mcp_client.call("ext_probe_record", {"tag": "refused", "extra": 1})
    assert refused.status is Status.INVALID_ARGUMENTS
    accepted = mcp_client.call("ext_probe_record", {"tag": "accepted"})
    assert accepted.status is Status.OK, accepted.content
    assert (marks / "called-accepted").exists()
    assert not (marks / "called-refused").exists()


def test_tools_command_lists_mcp_tools_with_annotations(mcp_fleet: Fleet) -> None:
    """`toolfleet tools --format mcp` lists the time server's tools with their annotations and
    outputSchema, and every probe tool (all pages of tools/list), names made safe."""
    env = {
        **os.environ,
        "TOOLFLEET_REDIS_URL": mcp_fleet.redis_url,
        "TOOLFLEET_NAMESPACE": mcp_fleet.namespace,
    }
    out = subprocess.run(
        [toolfleet_command(), "tools", "--format", "mcp"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    tools = {t["name"]: t for t in json.loads(out.stdout)}
    now = tools["ext_time_get_current_time"]
    assert now["annotations"]["readOnlyHint"] is True
    assert now["annotations"]["idempotentHint"] is True
    assert now["annotations"]["destructiveHint"] is False
    assert now["outputSchema"]["properties"]["timezone"] == {"title": "Timezone", "type": "string"}
    assert now["inputSchema"]["required"] == ["timezone"]
    probe = {name for name in tools if name.startswith("ext_probe_")}
    assert probe == {
        f"ext_probe_{t}"
        for t in (
            "echo", "util_upper_case", "slow", "count", "pid", "hold", "record", "crash", "fail",
            "picture", "big", "environment", "add_tool",
        )
    }  # fmt: skip
    assert tools["ext_probe_echo"]["annotations"]["idempotentHint"] is True
    assert not any(name.startswith(("ext_missing", "ext_crashing", "ext_silent")) for name in tools)


def test_a_dotted_mcp_name_routes_back_to_the_original(mcp_client: ToolClient) -> None:
    """ext_probe_util_upper_case calls the server's `util.upper-case` tool."""
    result = mcp_client.call("ext_probe_util_upper_case", {"text": "abc"})
    assert result.status is Status.OK, result.content
    assert result.content == {"result": "ABC"}


# -- deadlines, cancellation, progress ----------------------------------------------------


def test_slow_tool_times_out_by_its_limit_and_the_server_sees_the_cancellation(
    mcp_client: ToolClient, mcp_fleet: Fleet
) -> None:
    """A tool sleeping past its 1 s limit is answered timeout by the limit plus ``LATE_S``
    (measured from the call, queueing included), and the server's handler is cancelled."""
    marks: Path = mcp_fleet.marks  # type: ignore[attr-defined]
    label = uuid.uuid4().hex[:8]
    started = time.monotonic()
    result = mcp_client.call("ext_probe_slow", {"seconds": 30, "label": label}, timeout_s=20)
    elapsed = time.monotonic() - started
    assert result.status is Status.TIMEOUT
    assert "within 1 s" in result.content["error"]  # the worker's limit, not the client's
    assert elapsed <= 1.0 + LATE_S, elapsed
    _wait_for((marks / f"cancelled-{label}").exists, 5, "the server saw notifications/cancelled")


def test_call_deadline_times_out_and_the_server_sees_the_cancellation(
    mcp_client: ToolClient, mcp_fleet: Fleet
) -> None:
    """A call whose own deadline (0.8 s) comes before the tool's limit is answered timeout by
    the deadline (plus ``LATE_S``), and the server's handler is cancelled."""
    marks: Path = mcp_fleet.marks  # type: ignore[attr-defined]
    label = uuid.uuid4().hex[:8]
    started = time.monotonic()
    result = mcp_client.call("ext_probe_slow", {"seconds": 30, "label": label}, timeout_s=0.8)
    assert result.status is Status.TIMEOUT
    assert time.monotonic() - started <= 0.8 + LATE_S
    _wait_for((marks / f"cancelled-{label}").exists, 5, "the server saw notifications/cancelled")


def test_cancel_cancels_the_call_on_the_server(mcp_client: ToolClient, mcp_fleet: Fleet) -> None:
    """client.cancel() of a running MCP call answers canceled and cancels the server's handler."""
    marks: Path = mcp_fleet.marks  # type: ignore[attr-defined]
    label = uuid.uuid4().hex[:8]
    future = mcp_client.submit("ext_probe_slow", {"seconds": 30, "label": label}, timeout_s=20)
    time.sleep(0.5)  # running on the server by now
    assert mcp_client.cancel(future.call_id)
    assert future.result(timeout=5).status is Status.CANCELED
    _wait_for((marks / f"cancelled-{label}").exists, 5, "the server saw notifications/cancelled")


def test_progress_notifications_reach_a_streaming_caller(mcp_fleet: Fleet) -> None:
    """MCP progress notifications become progress events of AsyncToolClient.stream()."""
    turn = [
        {
            "id": "call_p",
            "type": "function",
            "function": {"name": "ext_probe_count", "arguments": json.dumps({"steps": 3})},
        }
    ]

    async def run() -> list[Any]:
        async with AsyncToolClient(mcp_fleet.redis_url, namespace=mcp_fleet.namespace) as c:
            return [event async for event in c.stream(turn, timeout_s=20)]

    events = asyncio.run(run())
    progress = [e.description for e in events if e.kind == "progress"]
    assert progress == ["step 1 (1/3)", "step 2 (2/3)", "step 3 (3/3)"]
    assert events[-1].kind == "result" and events[-1].status is Status.OK
    assert json.loads(events[-1].message["content"]) == {"result": "counted 3"}


# -- results ------------------------------------------------------------------------------


def test_is_error_becomes_tool_error_with_the_server_text(mcp_client: ToolClient) -> None:
    """A result with isError: true comes back tool_error with the server's text."""
    result = mcp_client.call("ext_probe_fail", {"message": "the disk is full"})
    assert result.status is Status.TOOL_ERROR
    assert "the disk is full" in result.content["error"]


def test_image_content_has_the_documented_shape(mcp_client: ToolClient) -> None:
    """An image block comes back as {type, mime_type, data (base64)}."""
    result = mcp_client.call("ext_probe_picture", {})
    assert result.status is Status.OK, result.content
    data = base64.b64encode(bytes.fromhex("89504e470d0a1a0a")).decode()
    assert result.content == [{"type": "image", "mime_type": "image/png", "data": data}]


def test_a_result_over_max_result_bytes_is_a_tool_error(mcp_client: ToolClient) -> None:
    """An MCP result larger than TOOLFLEET_MAX_RESULT_BYTES (100,000 here) is refused."""
    fits = mcp_client.call("ext_probe_big", {"size": 1000})
    assert fits.status is Status.OK
    result = mcp_client.call("ext_probe_big", {"size": 200_000})
    assert result.status is Status.TOOL_ERROR
    assert "over the limit of 100000 bytes" in result.content["error"]


def test_the_server_sees_a_minimal_env_and_its_secret_setting(mcp_client: ToolClient) -> None:
    """The stdio server gets only the base variables and the manifest's env, whose secret
    comes from the extension's setting; nothing else of the worker's environment."""
    result = mcp_client.call("ext_probe_environment", {})
    assert result.status is Status.OK, result.content
    env = result.content["env"]
    env.pop("LC_CTYPE", None)  # set by the server's own Python at start (PEP 538 coercion)
    assert set(env) <= {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "PROBE_TOKEN"}
    assert not any(name.startswith(("TOOLFLEET_", "PROBE_WORKER")) for name in env)
    assert env["PROBE_TOKEN"] == "[redacted]"  # the secret's value, scrubbed from the reply
    assert SECRET not in json.dumps(result.content)


def test_streamable_http_server_serves_its_tools(mcp_client: ToolClient) -> None:
    """A manifest with url = ... serves the HTTP server's tools through the fleet."""
    result = mcp_client.call("ext_remote_echo", {"text": "over http"})
    assert result.status is Status.OK, result.content
    assert result.content == {"result": "over http"}


# -- broken servers and the process count ---------------------------------------------------


def test_broken_servers_are_skipped_and_reported_while_the_others_serve(
    mcp_fleet: Fleet, mcp_client: ToolClient
) -> None:
    """A missing command, a server that exits at start and one that never answers initialize
    are reported as extension problems; the fleet serves the others."""
    errors = {Path(k).name: v for k, v in mcp_client.extension_errors().items()}
    assert "command not found" in errors["missing"]
    assert "not started" in errors["crashing"]
    assert "start timeout" in errors["silent"]
    assert mcp_client.call("ext_probe_echo", {"text": "fine"}).status is Status.OK
    assert mcp_client.call("ext_fleet_test_echo", {"text": "fine"}).status is Status.OK


def test_extensions_check_and_metrics_count_the_server_processes(mcp_fleet: Fleet) -> None:
    """`extensions check` shows one stdio server per worker process (2 in this fleet) and the
    broken ones; /metrics counts the same processes."""
    env = {
        **os.environ,
        "TOOLFLEET_REDIS_URL": mcp_fleet.redis_url,
        "TOOLFLEET_NAMESPACE": mcp_fleet.namespace,
        "TOOLFLEET_EXTENSION_PATHS": str(mcp_fleet.folder),  # type: ignore[attr-defined]
        "TOOLFLEET_EXT_PROBE_TOKEN": SECRET,
        "COLUMNS": "250",
    }
    # Reports follow heartbeats, and a server an earlier test killed may still be coming
    # back: read until both counts show 2 (or the time is up, and the asserts say why).
    deadline = time.monotonic() + 30
    while True:
        out = subprocess.run(
            [toolfleet_command(), "extensions", "check", "--no-entry-points"],
            env=env, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        rows = {line.split("│")[1].strip(): line for line in out.stdout.splitlines() if "│" in line}
        text = urllib.request.urlopen(
            f"http://127.0.0.1:{mcp_fleet.metrics_port}/metrics",  # type: ignore[attr-defined]
            timeout=5,
        ).read().decode()  # fmt: skip
        processes = {
            s.labels["extension"]: s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == "toolfleet_mcp_server_processes"
        }
        settled = all("2 running in the fleet" in rows.get(x, "") for x in ("probe", "time"))
        if (settled and processes.get("probe") == processes.get("time") == 2) or (
            time.monotonic() > deadline
        ):
            break
        time.sleep(1)
    assert out.returncode == 1, out.stdout + out.stderr  # the broken ones are problems
    assert SECRET not in out.stdout + out.stderr
    assert "2 running in the fleet" in rows["probe"]
    assert "2 running in the fleet" in rows["time"]
    assert "http (remote)" in rows["remote"]
    for broken in ("missing", "crashing", "silent"):
        assert f"{broken}:" in out.stdout
    assert processes.get("probe") == 2 and processes.get("time") == 2, processes


# -- a fleet of one worker process: crash, kill, list_changed, death with the worker -------


@pytest.fixture(scope="module")
def solo_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process serving the probe server (so every call meets the same server)."""
    tmp = tmp_path_factory.mktemp("mcp-solo")
    folder, marks = tmp / "extensions", tmp / "marks"
    _manifest(
        folder,
        "probe",
        f"[mcp]\ncommand = {json.dumps(sys.executable)}\nargs = {_probe_args(marks)}\n",
    )
    fleet = start_fleet(
        redis_url,
        f"{namespace}-mcp1-{uuid.uuid4().hex[:6]}",
        tmp / "worker.log",
        processes=1,
        env={"TOOLFLEET_EXTENSION_PATHS": str(folder)},
    )
    yield fleet
    fleet.stop()


def _server_pid(client: ToolClient) -> int:
    result = client.call("ext_probe_pid", {}, timeout_s=20)
    assert result.status is Status.OK, result.content
    return int(result.content["result"])


def _restarts(fleet: Fleet) -> int:
    reports = _mcp_reports(fleet)
    states = [r["servers"]["probe"] for r in reports.values() if "probe" in r["servers"]]
    return sum(s["restarts"] for s in states if s["state"] == "ready")


def test_a_killed_server_is_restarted_and_the_next_call_succeeds(solo_fleet: Fleet) -> None:
    """SIGKILL of the server answers its call in flight tool_error at once; the worker starts
    a new server and the next call succeeds on it."""
    with ToolClient(solo_fleet.redis_url, namespace=solo_fleet.namespace) as client:
        old_pid = _server_pid(client)
        before = _restarts(solo_fleet)
        in_flight = client.submit("ext_probe_slow", {"seconds": 30}, timeout_s=20)
        time.sleep(0.5)
        killed_at = time.monotonic()
        os.kill(old_pid, signal.SIGKILL)
        answer = in_flight.result(timeout=10)
        assert answer.status is Status.TOOL_ERROR
        assert "stopped during the call" in answer.content["error"]
        assert time.monotonic() - killed_at < 2.0
        _wait_for(lambda: _restarts(solo_fleet) > before, 40, "the worker restarted the server")
        result = client.call("ext_probe_echo", {"text": "again"}, timeout_s=20)
        assert result.status is Status.OK, result.content
        assert _server_pid(client) != old_pid


def test_a_crash_mid_call_is_answered_and_recovered(solo_fleet: Fleet) -> None:
    """A server exiting in the middle of a call answers it tool_error; calls succeed again
    once the worker restarted it."""
    with ToolClient(solo_fleet.redis_url, namespace=solo_fleet.namespace) as client:
        before = _restarts(solo_fleet)
        result = client.call("ext_probe_crash", {}, timeout_s=20)
        assert result.status is Status.TOOL_ERROR
        assert "stopped during the call" in result.content["error"]
        _wait_for(lambda: _restarts(solo_fleet) > before, 40, "the worker restarted the server")
        assert client.call("ext_probe_echo", {"text": "x"}, timeout_s=20).status is Status.OK


def test_list_changed_refreshes_the_catalog(solo_fleet: Fleet) -> None:
    """A tool the server adds at run time (notifications/tools/list_changed) is listed and
    callable through the fleet."""
    name = f"late.tool-{uuid.uuid4().hex[:6]}"
    function = "ext_probe_" + name.replace(".", "_").replace("-", "_")
    with ToolClient(solo_fleet.redis_url, namespace=solo_fleet.namespace) as client:
        assert client.call("ext_probe_add_tool", {"name": name}, timeout_s=20).status is Status.OK

        def listed() -> bool:
            return any(t["function"]["name"] == function for t in client.tools())

        _wait_for(listed, 10, f"{function} in the catalog")
        result = client.call(function, {}, timeout_s=20)
        assert result.status is Status.OK, result.content
        assert result.content == {"result": f"{name} was added at run time"}


def test_the_server_dies_with_its_worker_process(solo_fleet: Fleet) -> None:
    """SIGKILL of a worker process takes its MCP server with it (parent-death signal), even a
    server that could not exit on stdin EOF (a call blocks it); the supervisor's new worker
    process starts a new one."""
    with ToolClient(solo_fleet.redis_url, namespace=solo_fleet.namespace) as client:
        server = _server_pid(client)
        (worker,) = solo_fleet.worker_pids()
        client.submit("ext_probe_hold", {"seconds": 60}, timeout_s=30)
        time.sleep(0.5)
        os.kill(worker, signal.SIGKILL)
        _wait_for(lambda: not _alive(server), 5, "the MCP server died with its worker")
        _wait_for(lambda: _alive_other_worker(solo_fleet, worker), 60, "a new worker process")
        assert _server_pid(client) != server


def _alive_other_worker(fleet: Fleet, old: int) -> bool:
    return any(pid != old for pid in fleet.worker_pids()) and fleet.live_workers() >= 1


def test_drain_closes_the_server(solo_fleet: Fleet) -> None:
    """SIGTERM drains the worker and closes its MCP session: the server process is gone when
    the fleet has exited."""
    with ToolClient(solo_fleet.redis_url, namespace=solo_fleet.namespace) as client:
        server = _wait_for(lambda: _server_pid(client), 60, "a server answers")
    assert solo_fleet.stop() == 0
    _wait_for(lambda: not _alive(server), 5, "the MCP server stopped at drain")
