"""Redis commands per refresh of the ops page at 10 and at 10,000 calls per minute.

Starts a private ``redis-server`` and a fleet through the CLI (2 processes x 8 threads,
the tests' echo tool), runs calls at 10 per minute for one minute, then at 10,000 per
minute for one minute, and after each phase counts the commands of one snapshot
(:func:`toolfleet.ui.snapshot.read_snapshot`, what every page and stream of one ``ui``
process shares per refresh) with ``INFO commandstats`` (commands inside scripts
included), the fleet's processes stopped (SIGSTOP) meanwhile so that only the page's
reads are counted. Then a ``toolfleet ui`` serves the fleet and Chromium photographs
its overview at 1280 px for docs/ui.png. Prints JSON.

    .venv/bin/python bench/ui_refresh.py
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
import uuid
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import redis

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH.parent / "tests")]

from ui_support import TOKENS, start_ui, write_tokens  # noqa: E402

from conftest import Fleet, start_fleet  # noqa: E402
from private_redis import command_counts, start_tcp_server  # noqa: E402
from toolfleet.producer import ToolClient  # noqa: E402
from toolfleet.shared import ToolCallResult  # noqa: E402
from toolfleet.ui.snapshot import read_snapshot  # noqa: E402

ECHO = "ext_fleet_test_echo"
FAIL = "ext_fleet_test_fail"


def _run_at(client: ToolClient, per_minute: int, seconds: float) -> dict[str, int]:
    """Submit calls at an even pace for ``seconds``; every 50th fails on purpose."""
    start = time.monotonic()
    futures: list[Future[ToolCallResult]] = []
    total = int(per_minute * seconds / 60)
    for i in range(total):
        wait = start + i * 60 / per_minute - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if i % 50 == 49:
            futures.append(client.submit(FAIL, {"reason": "on purpose"}))
        else:
            futures.append(client.submit(ECHO, {"text": "x"}))
    statuses: dict[str, int] = {}
    for future in futures:
        status = future.result(timeout=300).status.value
        statuses[status] = statuses.get(status, 0) + 1
    return statuses


def _refresh_commands(fleet: Fleet, client: redis.Redis) -> dict[str, Any]:
    time.sleep(1.5)  # a heartbeat adds the last calls to the aggregates
    pids = [fleet.process.pid, *fleet.worker_pids()]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        read_snapshot(client, fleet.namespace, worker_ttl_s=3600)  # loads the script once
        client.config_resetstat()
        snapshot = read_snapshot(client, fleet.namespace, worker_ttl_s=3600)
        counts = command_counts(client)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    echo = snapshot.tool(ECHO)
    return {
        "commands": sum(counts.values()),
        "by_command": dict(sorted(counts.items())),
        "echo_calls_in_window": echo.total if echo else 0,
        "functions": len(snapshot.catalog),
        "queues": len(snapshot.queues),
        "workers": len(snapshot.workers),
    }


def _photograph(fleet: Fleet, folder: Path, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    ui = start_ui(fleet.redis_url, fleet.namespace, folder, "--tokens-file",
                  str(write_tokens(folder / "tokens.toml")))  # fmt: skip
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(ui.url + "/login")
            page.fill("input[name=token]", TOKENS["operator"])
            page.click("button[type=submit]")
            page.wait_for_url(ui.url + "/")
            page.screenshot(path=str(out), full_page=True)
            browser.close()
    finally:
        ui.stop()


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="toolfleet-ui-bench-"))
    server = start_tcp_server(folder)
    fleet = start_fleet(server.url, f"uibench-{uuid.uuid4().hex[:6]}", folder / "worker.log",
                        processes=2, threads=8)  # fmt: skip
    report: dict[str, Any] = {}
    try:
        client = redis.Redis.from_url(server.url)
        with ToolClient(server.url, namespace=fleet.namespace) as calls:
            for per_minute in (10, 10_000):
                statuses = _run_at(calls, per_minute, 60.0)
                report[f"{per_minute}_per_minute"] = {
                    "statuses": statuses,
                    **_refresh_commands(fleet, client),
                }
        _photograph(fleet, folder, BENCH.parent / "docs" / "ui.png")
    finally:
        fleet.stop()
        server.stop()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
