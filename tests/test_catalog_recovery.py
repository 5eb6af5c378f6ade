"""A catalog being republished after Redis lost its data, told apart from an unknown name.

Real Redis restarts (an embedded ``redis-server`` without persistence) and real worker
fleets: one fleet serves the test tools, a second only ``ext_a_b_dash`` on its own queue.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import redis

from conftest import Fleet, start_fleet, toolfleet_command
from toolfleet.producer import ToolClient
from toolfleet.shared import Status
from toolfleet.shared.naming import catalog_key, catalog_recovering_key

if TYPE_CHECKING:
    from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis

ECHO = "ext_fleet_test_echo"
DASH = "ext_a_b_dash"
NOBODY = "ext_nobody_serves_this"
WORKER_TTL_S = 10.0
ENV = {"TOOLFLEET_HEARTBEAT_INTERVAL_S": "0.5", "TOOLFLEET_WORKER_TTL_S": str(WORKER_TTL_S)}


def _eventually(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _fresh_producer_status(url: str, namespace: str, function: str) -> str:
    """The status a new producer process (the CLI, which has seen no catalog) answers."""
    env = {**os.environ, "TOOLFLEET_REDIS_URL": url, "TOOLFLEET_NAMESPACE": namespace}
    out = subprocess.run(
        [toolfleet_command(), "call", function, "{}", "--timeout", "5"],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    return str(json.loads(out.stdout)["status"])


def _dash_fleet(url: str, namespace: str, log: Path) -> Fleet:
    extra = ["--extension", "queue_names_ext:dash", "-Q", "tools.a-b"]
    return start_fleet(
        url, namespace, log, processes=1, extra=extra, env=ENV, ready_queue="tools.a-b"
    )


@contextlib.contextmanager
def _fleet_on_embedded_redis(
    tmp_path: Path,
) -> Iterator[tuple[EmbeddedRedis, str, redis.Redis, list[Fleet]]]:
    """An embedded Redis without persistence, a fresh namespace, a client of that Redis
    and a list holding one started fleet (logging to ``a.log``); the test may add fleets
    to the list or pop them, and every fleet still in it is stopped on exit."""
    from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis

    with EmbeddedRedis() as server:
        ns = f"tfrepublish-{uuid.uuid4().hex[:6]}"
        r = redis.Redis.from_url(server.url)
        fleets = [start_fleet(server.url, ns, tmp_path / "a.log", processes=1, env=ENV)]
        try:
            yield server, ns, r, fleets
        finally:
            for fleet in fleets:
                fleet.stop()
            r.close()


def test_a_partly_republished_catalog_answers_not_available_for_served_tools_only(
    tmp_path: Path,
) -> None:
    """A fresh fleet answers a name nobody serves unknown_function at once. After a Redis
    restart, while only the dash fleet has republished, a tool the other fleet served is
    not_available (retryable) to the producer that saw it and to a new producer process,
    and an unknown name is still unknown_function; once one worker TTL has passed and
    that fleet never came back, its tool is unknown_function; when it is back, ok."""
    with (
        _fleet_on_embedded_redis(tmp_path) as (server, ns, r, fleets),
        ToolClient(server.url, namespace=ns) as client,
    ):
        window_open = r.exists(catalog_recovering_key(ns))
        assert client.call(NOBODY, {}).status is Status.UNKNOWN_FUNCTION
        assert window_open and not r.smembers(catalog_recovering_key(ns)) - {b"*"}
        fleets.append(_dash_fleet(server.url, ns, tmp_path / "b.log"))
        _eventually(lambda: bool(r.hexists(catalog_key(ns), DASH)), 30, "dash listed")
        assert client.call(ECHO, {"text": "x"}).ok and client.call(DASH, {}).ok

        fleets.pop(0).stop()
        server.restart(keep_data=False)
        _eventually(lambda: bool(r.hexists(catalog_key(ns), DASH)), 30, "republished")
        assert not r.hexists(catalog_key(ns), ECHO)
        assert ECHO.encode() in r.smembers(catalog_recovering_key(ns))
        missing = client.call(ECHO, {"text": "x"})
        assert missing.status is Status.NOT_AVAILABLE, missing
        assert "republished" in missing.content["error"]
        assert client.call(NOBODY, {}).status is Status.UNKNOWN_FUNCTION
        assert client.call(DASH, {}).ok
        assert _fresh_producer_status(server.url, ns, ECHO) == "not_available"
        assert _fresh_producer_status(server.url, ns, NOBODY) == "unknown_function"

        closed = lambda: not r.exists(catalog_recovering_key(ns))  # noqa: E731
        _eventually(closed, WORKER_TTL_S + 10, "the recovery window closes")
        _eventually(
            lambda: client.call(ECHO, {"text": "x"}).status is Status.UNKNOWN_FUNCTION,
            5, "a tool whose worker left is unknown once the window closed",
        )  # fmt: skip

        fleets.append(start_fleet(server.url, ns, tmp_path / "c.log", processes=1,
                                  env=ENV))  # fmt: skip
        _eventually(lambda: client.call(ECHO, {"text": "x"}).ok, 10, "echo is back")


def test_a_producer_that_saw_a_tool_answers_not_available_when_no_worker_remembers_it(
    tmp_path: Path,
) -> None:
    """Redis and every worker restarted together (no worker remembers the old catalog):
    while the window is open, a producer process that saw the tool answers not_available
    for it, and unknown_function for a name it never saw."""
    with _fleet_on_embedded_redis(tmp_path) as (server, ns, r, fleets):
        with ToolClient(server.url, namespace=ns) as client:
            assert client.call(ECHO, {"text": "x"}).ok
        fleets.pop().stop()
        server.restart(keep_data=False)
        fleets.append(_dash_fleet(server.url, ns, tmp_path / "b.log"))
        _eventually(lambda: bool(r.hexists(catalog_key(ns), DASH)), 30, "dash listed")
        assert r.smembers(catalog_recovering_key(ns)) == {b"*"}  # nobody remembers
        with ToolClient(server.url, namespace=ns) as client:  # a new client, same process
            assert client.call(ECHO, {"text": "x"}).status is Status.NOT_AVAILABLE
            assert client.call(NOBODY, {}).status is Status.UNKNOWN_FUNCTION
            assert client.call(DASH, {}).ok
