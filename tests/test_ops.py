"""Operations: private metrics state, HTTP probes, ``top``, the producer's metrics registry."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import tempfile
import termios
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import Fleet, default_sigint, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.worker.supervision.exposition import (
    OWNER_LOCK,
    prepare_multiprocess_dir,
    sweep_private_dirs,
)

F = "ext_fleet_test_"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _calls_total(port: int) -> float:
    """Sum of ``toolfleet_tool_calls_total`` scraped from a supervisor's ``/metrics``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "toolfleet_tool_calls_total"
    )


def test_two_fleets_on_one_host_keep_private_metrics_folders(
    redis_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without PROMETHEUS_MULTIPROC_DIR, two fleets (2 + 1 processes) on one host each count
    only their own calls, and each fleet's exit removes its metrics folder."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    ports = [_free_port(), _free_port()]
    fleets = []
    try:
        for i, (processes, port) in enumerate(zip((2, 1), ports, strict=True)):
            env = {"TMPDIR": str(tmp), "TOOLFLEET_METRICS_PORT": str(port)}
            ns = f"{namespace}-mp{i}-{uuid.uuid4().hex[:6]}"
            fleets.append(
                start_fleet(redis_url, ns, tmp_path / f"w{i}.log", processes=processes, env=env)
            )
        folders = sorted(tmp.glob("toolfleet-metrics-*"))
        assert len(folders) == 2, folders
        for fleet, calls in zip(fleets, (7, 3), strict=True):
            with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
                for i in range(calls):
                    result = client.call(F + "add", {"a": i, "b": 1}, timeout_s=20)
                    assert result.status.value == "ok"
        assert [_calls_total(p) for p in ports] == [7.0, 3.0]
        first = fleets.pop(0)
        assert first.stop() == 0
        assert len(list(tmp.glob("toolfleet-metrics-*"))) == 1
        assert _calls_total(ports[1]) == 3.0  # the first fleet's exit wiped nothing of ours
    finally:
        for fleet in fleets:
            fleet.stop()
    assert list(tmp.iterdir()) == []


def test_a_sweep_removes_only_private_metrics_folders_that_no_process_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held, lockless and foreign folders stay; an unheld private folder goes."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # Given a live supervisor's folder (held by this process)
    live = prepare_multiprocess_dir(None)
    try:
        # and a dead supervisor's (its lock file, held by nobody)
        dead = tmp_path / "toolfleet-metrics-dead"
        dead.mkdir()
        (dead / OWNER_LOCK).touch()
        (dead / "counter_123.db").write_bytes(b"x")
        # and one of an older version (no lock file), and someone else's folder
        lockless = tmp_path / "toolfleet-metrics-older"
        lockless.mkdir()
        other = tmp_path / "something-else"
        other.mkdir()
        (other / OWNER_LOCK).touch()
        # When the next supervisor sweeps
        removed = sweep_private_dirs(tmp_path)
        # Then only the dead supervisor's folder is gone
        assert removed == [dead]
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
            [live.path.name, "toolfleet-metrics-older", "something-else"]
        )
        assert (live.path / OWNER_LOCK).exists()
    finally:
        live.remove()
    assert not live.path.exists()


def test_the_folder_of_a_sigkilled_supervisor_is_removed_by_the_next_one(
    redis_url: str, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor killed outright leaves its metrics folder; the next fleet's start removes it."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {"TMPDIR": str(tmp)}
    # Given a fleet whose supervisor is SIGKILLed (its worker processes follow it)
    first = start_fleet(redis_url, f"{namespace}-k1", tmp_path / "w1.log", processes=1, env=env)
    try:
        (left,) = tmp.glob("toolfleet-metrics-*")
        children = first.worker_pids()
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(pid) for pid in children), children
    finally:
        first.stop()
    assert left.exists()
    # When the next fleet starts on the host
    second = start_fleet(redis_url, f"{namespace}-k2", tmp_path / "w2.log", processes=1, env=env)
    try:
        # Then the dead supervisor's folder is gone and the new one's is there
        assert not left.exists()
        assert len(list(tmp.glob("toolfleet-metrics-*"))) == 1
    finally:
        second.stop()
    assert list(tmp.iterdir()) == []


def test_a_second_worker_on_a_taken_metrics_port_warns_once_and_serves(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A worker whose /metrics port is taken (another worker on the host holds it) logs one
    WARNING line naming the port and TOOLFLEET_METRICS_PORT, no ERROR, and serves calls."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))
        holder.listen()
        port = int(holder.getsockname()[1])
        ns = f"{namespace}-port-{uuid.uuid4().hex[:6]}"
        log = tmp_path / "worker.log"
        fleet = start_fleet(
            redis_url, ns, log, processes=1, env={"TOOLFLEET_METRICS_PORT": str(port)}
        )
        try:
            with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
                assert client.call(F + "add", {"a": 1, "b": 2}, timeout_s=20).content == 3
        finally:
            fleet.stop()
    lines = log.read_text().splitlines()
    assert not [line for line in lines if " ERROR " in line], lines
    taken = [line for line in lines if f"port {port} is taken" in line]
    assert len(taken) == 1 and " WARNING " in taken[0], lines
    assert "TOOLFLEET_METRICS_PORT" in taken[0]


def _probe(port: int, path: str) -> tuple[int, str]:
    """Status code and body of ``GET path`` on a supervisor's HTTP server."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return int(reply.status), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _probe_until(port: int, path: str, status: int, within_s: float = 15.0) -> tuple[int, str]:
    """``GET path`` until it answers ``status`` or ``within_s`` s pass: the last answer.

    A worker process rewrites its heartbeat file once a second, so readiness follows what
    the fleet does by up to a beat (more on a loaded machine), as a Kubernetes probe sees it.
    """
    deadline = time.monotonic() + within_s
    answer = _probe(port, path)
    while answer[0] != status and time.monotonic() < deadline:
        time.sleep(0.2)
        answer = _probe(port, path)
    return answer


@pytest.fixture(scope="module")
def probe_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process with /metrics, /livez and /readyz on a free port; stale after 3 s."""
    tmp = tmp_path_factory.mktemp("probes")
    port = _free_port()
    fleet = start_fleet(
        redis_url,
        f"{namespace}-probe-{uuid.uuid4().hex[:6]}",
        tmp / "worker.log",
        processes=1,
        env={"TOOLFLEET_METRICS_PORT": str(port), "TOOLFLEET_HEALTH_STALE_S": "3"},
    )
    fleet.metrics_port = port  # type: ignore[attr-defined]
    yield fleet
    fleet.stop()


def test_livez_and_readyz_pass_on_a_healthy_fleet_and_metrics_still_serve(
    probe_fleet: Fleet,
) -> None:
    """/livez and /readyz answer 200 with health's reason; /metrics is unchanged beside them."""
    port = probe_fleet.metrics_port  # type: ignore[attr-defined]
    assert _probe_until(port, "/livez", 200) == (200, "1 worker process healthy\n")
    assert _probe_until(port, "/readyz", 200) == (
        200,
        "1 worker process healthy, Redis reachable\n",
    )
    status, body = _probe(port, "/metrics")
    assert status == 200 and "toolfleet_worker_up" in body
    assert "toolfleet_queue_depth" not in body, "fleet-wide gauges come from the exporter only"


def test_livez_fails_while_a_tool_blocks_its_thread_and_recovers(probe_fleet: Fleet) -> None:
    """An async tool blocking its event-loop thread makes /livez (and /readyz) answer 503
    within the stale window; /livez is 200 again once it returns."""
    port = probe_fleet.metrics_port  # type: ignore[attr-defined]
    with ToolClient(probe_fleet.redis_url, namespace=probe_fleet.namespace) as client:
        future = client.submit(F + "block_loop", {"seconds": 8}, timeout_s=30)
        deadline = time.monotonic() + 8
        failed: tuple[int, str] = (0, "")
        while time.monotonic() < deadline and failed[0] != 503:
            failed = _probe(port, "/livez")
            time.sleep(0.3)
        assert failed[0] == 503 and "has not been healthy" in failed[1], failed
        assert _probe(port, "/readyz")[0] == 503
        future.result()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _probe(port, "/livez")[0] != 200:
        time.sleep(0.3)
    assert _probe(port, "/livez")[0] == 200


def test_readyz_fails_when_redis_is_unreachable(namespace: str, tmp_path: Path) -> None:
    """/readyz answers 503 naming Redis once the fleet's Redis stops; /livez stays 200
    (liveness needs no Redis)."""
    from private_redis import start_tcp_server

    server = start_tcp_server(tmp_path)
    port = _free_port()
    try:
        fleet = start_fleet(
            server.url,
            f"{namespace}-down-{uuid.uuid4().hex[:6]}",
            tmp_path / "worker.log",
            processes=1,
            env={"TOOLFLEET_METRICS_PORT": str(port)},
        )
        try:
            ready = _probe_until(port, "/readyz", 200)
            assert ready[0] == 200, ready
            server.stop()
            status, body = _probe_until(port, "/readyz", 503)
            assert status == 503 and "Redis unreachable" in body, body
            assert _probe(port, "/livez")[0] == 200
        finally:
            fleet.stop()
    finally:
        server.stop()


def _top_rows(fleet: Fleet) -> tuple[list[str], dict[str, list[str]]]:
    """``toolfleet top --once`` in 80 columns: its lines and the function table's rows."""
    env = {
        **os.environ,
        "TOOLFLEET_REDIS_URL": fleet.redis_url,
        "TOOLFLEET_NAMESPACE": fleet.namespace,
        "COLUMNS": "80",
    }
    argv = [toolfleet_command(), "top", "--once"]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=True)
    lines = out.stdout.splitlines()
    return lines, _function_rows(lines)


def _function_rows(lines: list[str]) -> dict[str, list[str]]:
    """The rows of a frame's function table: name -> [calls/s, busy, p50, p99, errors]."""
    rows: dict[str, list[str]] = {}
    header = [i for i, line in enumerate(lines) if line.split()[:2] == ["function", "calls/s"]]
    for line in lines[header[0] + 1 :] if header else []:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != 6:
            break  # the table ended (a caption, the next table's title)
        rows[cells[0]] = cells[1:]
    return rows


def test_top_busy_counts_only_running_time_and_fits_80_columns(probe_fleet: Fleet) -> None:
    """`top`'s busy column is the mean number of calls running over its 60 s window: calls
    answered without running (invalid arguments) add nothing, a 6 s call adds 0.1; every
    line of `top --once` fits 80 columns."""
    with ToolClient(probe_fleet.redis_url, namespace=probe_fleet.namespace) as client:
        for _ in range(5):
            result = client.call(F + "add", '{"a": 1', timeout_s=20)
            assert result.status.value == "invalid_arguments"
        assert client.call(F + "slow", {"seconds": 6}, timeout_s=30).status.value == "ok"
    lines, rows = _top_rows(probe_fleet)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert rows[F + "add"][1] == "0.00", rows
    assert rows[F + "add"][4] == "5 invalid_arguments", rows
    assert 0.09 <= float(rows[F + "slow"][1]) <= 0.2, rows


#: What rich's live display writes before each redrawn frame: back to the first line of
#: the previous frame, erasing it line by line.
_REDRAW = re.compile(r"\r\x1b\[2K(?:\x1b\[1A\x1b\[2K)*")
_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _live_frames(raw: bytes) -> list[list[str]]:
    """The whole frames a live view wrote to a terminal, as the lines on the screen."""
    pieces = _REDRAW.split(raw.decode("utf-8", "replace"))
    frames = []
    for piece in pieces[:-1]:  # the last may still be being written
        text = _ESCAPE.sub("", piece).replace("\r\n", "\n").replace("\r", "")
        if text.strip():
            frames.append(text.split("\n"))
    return frames


def _in_a_terminal(argv: list[str], env: dict[str, str], rows: int, columns: int) -> Any:
    """Start ``argv`` with a pseudo-terminal of ``rows`` x ``columns`` as its stdio."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env,
                               preexec_fn=default_sigint, close_fds=True)  # fmt: skip
    os.close(slave)
    return process, master


def _read_some(master: int, wait_s: float) -> bytes:
    ready, _, _ = select.select([master], [], [], wait_s)
    if not ready:
        return b""
    try:
        return os.read(master, 65536)
    except OSError:  # the terminal's other side closed (the process ended)
        return b""


def test_top_in_an_80x24_terminal_shows_the_live_tables_in_every_frame(probe_fleet: Fleet) -> None:
    """`toolfleet top` in a terminal of 80 columns and 24 lines (a pty), while calls run,
    shows in every frame, within the screen (no `...` where the display cut it): the catalog
    in one line, the queues, the workers and the function table with calls/s, p50/p99 and
    errors. Neither the long catalog (the built-in extensions and the test ones) nor the
    thirty-odd functions called push anything off: the busiest rows are shown and a line
    says how many more there are."""
    url, ns = probe_fleet.redis_url, probe_fleet.namespace
    stop = threading.Event()
    with ToolClient(url, namespace=ns) as client:
        names = [t["function"]["name"] for t in client.tools()]
        bfcl = [name for name in names if name.startswith("ext_bfcl_")]
        assert len(bfcl) > 24, bfcl

        def calls() -> None:  # ok calls to add, invalid ones to every bfcl tool
            while not stop.is_set():
                pending = [client.submit(F + "add", {"a": i, "b": 1}) for i in range(10)]
                pending += [client.submit(name, {}) for name in bfcl]
                for future in pending:
                    future.result()

        caller = threading.Thread(target=calls, daemon=True)
        caller.start()
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        env |= {"TOOLFLEET_REDIS_URL": url, "TOOLFLEET_NAMESPACE": ns, "TERM": "xterm-256color"}
        process, master = _in_a_terminal(
            [toolfleet_command(), "top", "--interval", "0.5"], env, rows=24, columns=80
        )
        raw = b""
        try:
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline and process.poll() is None:
                raw += _read_some(master, 0.5)
                called = [f for f in _live_frames(raw) if _called(f, F + "add")]
                if len(called) >= 3:
                    break
            frames = _live_frames(raw)  # read while it runs: no Ctrl-C yet
            assert process.poll() is None, raw.decode(errors="replace")[-3000:]
            process.send_signal(signal.SIGINT)
            deadline = time.monotonic() + 30
            while process.poll() is None and time.monotonic() < deadline:
                _read_some(master, 0.2)  # the terminal keeps reading: its last frame
            assert process.wait(timeout=5) == 0
        finally:
            stop.set()
            if process.poll() is None:
                process.kill()
                process.wait()
            os.close(master)
            caller.join(timeout=60)
    shown = "\n\n".join("\n".join(frame) for frame in frames)
    assert len([f for f in frames if _called(f, F + "add")]) >= 3, shown[-4000:]
    for frame in frames:
        text = "\n".join(frame)
        assert len(frame) <= 24 and max(map(len, frame)) <= 80, text
        assert "..." not in [line.strip() for line in frame], text
        assert frame[0].startswith("catalog: ") and " functions in " in frame[0], text
        assert any(line.split()[:1] == ["tools.fleet-test"] for line in frame), text
        assert any(line.split()[:2] == ["host", "worker"] for line in frame), text
        header = [line.split() for line in frame if line.startswith("function ")]
        assert header == [["function", "calls/s", "busy", "p50", "ms", "p99", "ms", "errors"]]
    last = frames[-1]
    rows = _function_rows(last)
    add = rows[F + "add"]
    assert float(add[0]) > 0 and add[2] != "-" and add[3] != "-", last  # p50, p99 of its runs
    bfcl_rows = [cells for name, cells in rows.items() if name.startswith("ext_bfcl_")]
    assert bfcl_rows and all(" invalid_argum" in cells[4] for cells in bfcl_rows), last
    assert any(re.fullmatch(r"\+\d+ more functions", line.strip()) for line in last), last


def _called(frame: list[str], function: str) -> bool:
    """Whether ``frame``'s function table shows calls of ``function``."""
    row = _function_rows(frame).get(function)
    return row is not None and float(row[0]) > 0


def test_top_without_a_terminal_prints_plain_frames_while_it_runs(probe_fleet: Fleet) -> None:
    """`toolfleet top` writing to a pipe prints each frame whole as it goes, after a line with
    its time and without terminal control codes, and exits 0 on Ctrl-C."""
    env = {
        **os.environ,
        "TOOLFLEET_REDIS_URL": probe_fleet.redis_url,
        "TOOLFLEET_NAMESPACE": probe_fleet.namespace,
    }
    argv = [toolfleet_command(), "top", "--interval", "0.2"]
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=default_sigint
    )
    assert process.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(
        target=lambda: lines.extend(line.decode() for line in process.stdout or ()), daemon=True
    )
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _headers(lines) < 3:
            time.sleep(0.1)
        assert _headers(lines) >= 3 and process.poll() is None, "".join(lines)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    reader.join(timeout=10)
    text = "".join(lines)
    assert "\x1b" not in text, text
    frames = text.split("toolfleet top at ")[1:]
    whole = frames[:-1]  # the last may be cut short by the Ctrl-C
    assert len(whole) >= 2, text
    assert all(" UTC\n" in frame and "queues" in frame and "workers" in frame for frame in whole)
    assert all("tools.fleet-test" in frame for frame in whole), text


def _headers(lines: list[str]) -> int:
    return sum(1 for line in list(lines) if line.startswith("toolfleet top at "))


def test_producer_metrics_register_in_the_host_registry(probe_fleet: Fleet) -> None:
    """After metrics.register(host), a call's duration shows in the host app's registry with
    the same count as the producer's own; registering twice is harmless; a name clash is a
    ValueError that leaves the host registry as it was."""
    from prometheus_client import CollectorRegistry, Counter

    from toolfleet.producer import metrics

    host = CollectorRegistry()
    metrics.register(host)
    metrics.register(host)
    labels = {"function": F + "add", "status": "ok"}
    name = "toolfleet_client_call_duration_seconds_count"
    before = metrics.REGISTRY.get_sample_value(name, labels) or 0.0
    with ToolClient(probe_fleet.redis_url, namespace=probe_fleet.namespace) as client:
        for i in range(3):
            assert client.call(F + "add", {"a": i, "b": 1}, timeout_s=20).status.value == "ok"
    assert metrics.REGISTRY.get_sample_value(name, labels) == before + 3
    assert host.get_sample_value(name, labels) == before + 3
    clash = CollectorRegistry()
    Counter("toolfleet_client_late_replies", "taken", registry=clash)
    with pytest.raises(ValueError):
        metrics.register(clash)
    assert clash.get_sample_value(name, labels) is None


def test_clients_take_the_host_registry_for_their_metrics(probe_fleet: Fleet) -> None:
    """ToolClient(registry=host) and AsyncToolClient(registry=host) put the producer's
    metrics in the host registry (each call counted there once); a registry holding one of
    their names is refused with ClientError."""
    import asyncio

    from prometheus_client import CollectorRegistry, Counter

    from toolfleet.producer import AsyncToolClient
    from toolfleet.shared.errors import ClientError

    url, ns = probe_fleet.redis_url, probe_fleet.namespace
    labels = {"function": F + "echo", "status": "ok"}
    name = "toolfleet_client_call_duration_seconds_count"
    host = CollectorRegistry()
    with ToolClient(url, namespace=ns, registry=host) as client:
        before = host.get_sample_value(name, labels) or 0.0
        assert client.call(F + "echo", {"text": "x"}, timeout_s=20).status.value == "ok"
    assert host.get_sample_value(name, labels) == before + 1

    async def one_async_call() -> None:
        async with AsyncToolClient(url, namespace=ns, registry=host) as client:
            result = await client.call(F + "echo", {"text": "y"}, timeout_s=20)
            assert result.status.value == "ok"

    asyncio.run(one_async_call())
    assert host.get_sample_value(name, labels) == before + 2
    clash = CollectorRegistry()
    Counter("toolfleet_client_late_replies", "taken", registry=clash)
    with pytest.raises(ClientError, match="registry"):
        ToolClient(url, namespace=ns, registry=clash)
