"""Operations: private metrics state, HTTP probes, ``top``, the producer's metrics registry."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

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
    rows: list[list[str]] = []
    for line in lines:
        cells = [c.strip() for c in line.split("\u2502")][1:-1]
        if len(cells) != 6:
            continue
        if cells[1] or not rows:  # a new row; otherwise its cells wrapped onto this line
            rows.append(cells)
        else:
            rows[-1] = [
                a + b if i == 0 else f"{a} {b}".strip()
                for i, (a, b) in enumerate(zip(rows[-1], cells, strict=True))
            ]
    return lines, {r[0]: r[1:] for r in rows if r[0].startswith(F)}


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
    assert "invalid_arguments: 5" in rows[F + "add"][4], rows
    assert 0.09 <= float(rows[F + "slow"][1]) <= 0.2, rows


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
