"""Operations: each supervisor's private metrics state."""

from __future__ import annotations

import socket
import urllib.request
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import start_fleet
from toolfleet.producer import ToolClient

F = "ext_fleet_test_"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
