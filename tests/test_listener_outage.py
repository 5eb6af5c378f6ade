"""A client's reply listener rides out a Redis outage with one line when it starts and one
when it ends: no traceback, and no WARNING per reconnect attempt.

A private redis-server on a unix socket (stopping it removes the socket, as when an
embedded server goes away), a real fleet for the call that starts the listener, both
clients.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import Fleet, start_fleet
from private_redis import Server, start_unix_server
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared import Status

ADD = "ext_fleet_test_add"
LISTENER = "toolfleet.producer.listener"
#: How long the outage lasts, seconds: long enough for five reconnect attempts.
OUTAGE_S = 2.0


@dataclass
class Outage:
    """A private server, its folder and the fleet on it; ``begin`` stops both, ``end``
    starts the server again on the same socket."""

    folder: Path
    server: Server
    fleet: Fleet

    @property
    def url(self) -> str:
        return self.server.url

    def begin(self) -> None:
        self.fleet.stop()
        self.server.stop()

    def end(self) -> None:
        sock = Path(self.url.removeprefix("unix://"))
        self.server = start_unix_server(self.folder, sock, name="redis-again")


@pytest.fixture
def outage(tmp_path: Path) -> Iterator[Outage]:
    server = start_unix_server(tmp_path)
    fleet = start_fleet(server.url, f"tfout-{uuid.uuid4().hex[:6]}", tmp_path / "worker.log",
                        processes=1, threads=2)  # fmt: skip
    state = Outage(tmp_path, server, fleet)
    try:
        yield state
    finally:
        state.fleet.stop()
        state.server.stop()
        shutil.rmtree(Path(state.url.removeprefix("unix://")).parent, ignore_errors=True)


def _listener_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LISTENER]


def _wait_for_back(caplog: pytest.LogCaptureFixture, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not any("is back" in r.getMessage() for r in _listener_records(caplog)):
        assert time.monotonic() < deadline, [r.getMessage() for r in _listener_records(caplog)]
        time.sleep(0.05)


def _check_lines(caplog: pytest.LogCaptureFixture) -> None:
    """One WARNING for the outage, one INFO for its end, the attempts at DEBUG, and no
    record with a traceback."""
    records = _listener_records(caplog)
    warnings = [r for r in records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "Redis unreachable" in warnings[0].getMessage()
    attempts = [r for r in records if r.levelno == logging.DEBUG and "attempt" in r.getMessage()]
    assert len(attempts) >= 2, [r.getMessage() for r in records]
    assert [r for r in records if r.levelno == logging.INFO and "is back" in r.getMessage()]
    assert not [r for r in records if r.exc_info], [r.getMessage() for r in records]


def test_the_sync_listener_reports_an_outage_once_and_its_end_once(
    outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LISTENER)
    with ToolClient(outage.url, namespace=outage.fleet.namespace) as client:
        assert client.call(ADD, {"a": 1, "b": 2}, timeout_s=30).status is Status.OK
        outage.begin()
        time.sleep(OUTAGE_S)
        outage.end()
        _wait_for_back(caplog)
    _check_lines(caplog)


def test_the_async_listener_reports_an_outage_once_and_its_end_once(
    outage: Outage, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LISTENER)

    async def run() -> None:
        async with AsyncToolClient(outage.url, namespace=outage.fleet.namespace) as client:
            result = await client.call(ADD, {"a": 1, "b": 2}, timeout_s=30)
            assert result.status is Status.OK
            await asyncio.to_thread(outage.begin)
            await asyncio.sleep(OUTAGE_S)
            await asyncio.to_thread(outage.end)
            await asyncio.to_thread(_wait_for_back, caplog)

    asyncio.run(run())
    _check_lines(caplog)
