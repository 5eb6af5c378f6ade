"""The catalog over a fleet's life, with real fleets: a renamed tool's old name leaves every
listing within one heartbeat TTL, a rolling upgrade keeps both names, a removed extension's
queue stops paging, two fleets exporting one name keep it for the first tool, and a call
pinned to the schema its model was shown is refused by a worker with another schema."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import redis
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from test_fleet_metrics import ALERTS, Exporter, _free_port, _promtool, _samples

from conftest import (
    TESTS,
    Either,
    Fleet,
    delete_namespace,
    enqueue_raw,
    start_fleet,
    toolfleet_command,
)
from toolfleet.producer import ToolClient
from toolfleet.shared import Status, codec
from toolfleet.shared.catalog_life import PUBLISH_SCRIPT, live_schemas
from toolfleet.shared.export import SCHEMA_HASH_KEY
from toolfleet.shared.naming import (
    catalog_key,
    catalog_live_key,
    catalog_owners_key,
    catalog_schemas_key,
    catalog_workers_key,
    events_key,
)
from toolfleet.shared.settings import Settings
from toolfleet.shared.wire import ReplyEnvelope, ToolCallRequest, new_call_id

#: The heartbeat TTL of every fleet, client, gateway, exporter and ``top`` here, seconds.
TTL_S = 3.0
#: Time past one TTL a listing may take to show a change: the reader's catalog cache
#: (0.2 s), one heartbeat (0.5 s), and one round of the slowest view (``top`` and the
#: gateway are processes of their own) on a loaded machine.
MARGIN_S = 5.0
OLD, NEW, MEASURE = "ext_ren_old_name", "ext_ren_new_name", "ext_ren_measure"
SHARED = "ext_a_b_c"
ENV = {"TOOLFLEET_WORKER_TTL_S": str(TTL_S), "TOOLFLEET_CATALOG_CACHE_S": "0.2"}


def _settings() -> Settings:
    return Settings(worker_ttl_s=TTL_S, catalog_cache_s=0.2)


def _eventually(check: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``check()`` held (polled); fails after ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if check():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _env(url: str, ns: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TESTS), "TOOLFLEET_REDIS_URL": url,
            "TOOLFLEET_NAMESPACE": ns, "COLUMNS": "250", **ENV}  # fmt: skip


class GatewayProbe:
    """One ``toolfleet mcp serve`` (stdio, the real CLI) with an open SDK session, driven
    from blocking code: each :meth:`do` runs one coroutine on the session's own loop."""

    def __init__(self, url: str, ns: str) -> None:
        params = StdioServerParameters(
            command=toolfleet_command(), args=["mcp", "serve"], env=_env(url, ns)
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._opened: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._served = asyncio.run_coroutine_threadsafe(self._serve(params), self._loop)
        self._opened.result(60)

    async def _serve(self, params: StdioServerParameters) -> None:
        async with Client(params, mode="legacy") as client:
            self._opened.set_result(None)
            while True:
                job = await self._queue.get()
                if job is None:
                    return
                step, done = job
                try:
                    done.set_result(await step(client))
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    done.set_exception(exc)

    def do(self, step: Callable[[Client], Awaitable[Any]]) -> Any:
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._loop.call_soon_threadsafe(self._queue.put_nowait, (step, done))
        return done.result(60)

    def tools(self) -> dict[str, types.Tool]:
        async def step(client: Client) -> Any:
            return (await client.list_tools()).tools

        return {tool.name: tool for tool in self.do(step)}

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
        self._served.result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


def _top(url: str, ns: str) -> str:
    out = subprocess.run([toolfleet_command(), "top", "--once", "--catalog"], capture_output=True,
                         text=True, env=_env(url, ns), timeout=60, check=True)  # fmt: skip
    return out.stdout


def _top_names(url: str, ns: str) -> set[str]:
    """The function names of ``top --catalog``'s catalog table (the frame's last table)."""
    lines = _top(url, ns).splitlines()
    titles = [i for i, line in enumerate(lines) if line.strip() == "catalog"]
    assert titles, lines
    words = " ".join(lines[titles[-1] :]).replace("│", " ").split()
    return {word for word in words if word.startswith("ext_")}


def _exporter_functions(exporter: Exporter) -> dict[str, float]:
    return {
        dict(labels)["function"]: value
        for (name, labels), value in _samples(exporter.port).items()
        if name == "toolfleet_function_workers"
    }


def _exporter_queues(exporter: Exporter) -> dict[str, float]:
    return {
        dict(labels)["queue"]: value
        for (name, labels), value in _samples(exporter.port).items()
        if name == "toolfleet_queue_workers"
    }


def _listed(client: Either) -> set[str]:
    return {t["function"]["name"] for t in client.tools()}


@pytest.fixture
def ns(redis_url: str, namespace: str) -> Iterator[str]:
    """A fresh namespace, deleted afterwards."""
    name = f"{namespace}-life-{uuid.uuid4().hex[:6]}"
    yield name
    delete_namespace(redis_url, name)


@pytest.fixture
def fleets() -> Iterator[list[Fleet]]:
    """Fleets a test starts; every one still running is stopped at the end."""
    started: list[Fleet] = []
    yield started
    for fleet in started:
        fleet.stop()


def _fleet(url: str, ns: str, log: Path, *specs: str, env: dict[str, str] | None = None) -> Fleet:
    extra = [arg for spec in specs for arg in ("--extension", f"catalog_life_ext:{spec}")]
    return start_fleet(url, ns, log, processes=1, threads=4, extra=extra,
                       env={**ENV, **(env or {})})  # fmt: skip


def test_a_renamed_tools_old_name_leaves_every_listing_within_one_ttl(
    redis_url: str, ns: str, fleets: list[Fleet], tmp_path: Path
) -> None:
    """Version 1 serves old_name, version 2 new_name. While both run (a rolling upgrade,
    longer than a TTL), both names are in both clients' tools(), the gateway's tools/list,
    top and the exporter, and each reaches its version; once the last version-1 worker
    stops, old_name leaves all five within one TTL (plus the readers' margin), calls to it
    answer unknown_function, and new_name stays."""
    clients = [Either(kind, redis_url, namespace=ns, settings=_settings())
               for kind in ("sync", "async")]  # fmt: skip
    fleets.append(_fleet(redis_url, ns, tmp_path / "v1.log", "ren_v1"))
    exporter = Exporter(redis_url, ns, tmp_path / "exporter.log")
    gateway = GatewayProbe(redis_url, ns)
    try:
        views: dict[str, Callable[[], set[str]]] = {
            "sync tools()": lambda: _listed(clients[0]),
            "async tools()": lambda: _listed(clients[1]),
            "gateway tools/list": lambda: set(gateway.tools()),
            "top": lambda: _top_names(redis_url, ns),
            "exporter": lambda: set(_exporter_functions(exporter)),
        }
        _eventually(lambda: all(OLD in view() for view in views.values()), 30, "v1 listed")

        # Given: a rolling upgrade, both versions serving for longer than one TTL.
        fleets.append(_fleet(redis_url, ns, tmp_path / "v2.log", "ren_v2"))
        _eventually(lambda: all(NEW in view() for view in views.values()), 30, "v2 listed")
        time.sleep(TTL_S + 1)
        for what, view in views.items():
            assert {OLD, NEW} <= view(), f"{what} lost a name during the rolling upgrade"
        for client in clients:
            assert client.call(OLD, {}).content == "ren/old_name@1.0.0"
            assert client.call(NEW, {}).content == "ren/new_name@2.0.0"

        # When: the last version-1 worker stops.
        fleets.pop(0).stop()
        stopped = time.monotonic()

        # Then: old_name leaves every listing within one TTL; new_name stays.
        left: dict[str, float] = {}

        def all_left() -> bool:
            for what, view in views.items():
                if what not in left and OLD not in view():
                    left[what] = time.monotonic() - stopped
            return len(left) == len(views)

        _eventually(all_left, TTL_S + MARGIN_S, f"old name left every listing (so far {left})")
        print(f"old name left after (s): { {k: round(v, 2) for k, v in left.items()} }")
        for what, view in views.items():
            assert NEW in view(), f"{what} lost the new name"
        for client in clients:
            gone = client.call(OLD, {})
            assert gone.status is Status.UNKNOWN_FUNCTION, gone
            assert client.call(NEW, {}).content == "ren/new_name@2.0.0"
    finally:
        gateway.close()
        assert exporter.stop() == 0
        for client in clients:
            client.stop()


#: The queues the alert test looks at: the removed extension's and the test tools'.
WATCHED = ("tools.fleet-test", "tools.gone")


def _alert_test(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], firing: list[str]
) -> dict[str, Any]:
    """A promtool test case: ``samples`` (the exporter's, as scraped; of the queues in
    WATCHED) held for 30 minutes, and the queues ``ToolfleetNoWorkersForQueue`` must be
    firing for at minute 20."""
    series = []
    for (name, labels), value in sorted(samples.items()):
        if (
            not name.startswith("toolfleet_")
            or dict(labels).get("queue", WATCHED[0]) not in WATCHED
        ):
            continue
        every = {**dict(labels), "job": "toolfleet-exporter", "namespace": "toolfleet"}
        text = ",".join(f'{k}="{v}"' for k, v in sorted(every.items()))
        series.append({"series": f"{name}{{{text}}}", "values": f"{value}x30"})
    expected = [
        {"exp_labels": {"queue": queue, "severity": "page", "job": "toolfleet-exporter",
                        "namespace": "toolfleet"},
         "exp_annotations": {"summary": f"No live worker serves queue {queue}: its calls "
                                        "answer not_available."}}
        for queue in firing
    ]  # fmt: skip
    return {
        "interval": "1m",
        "input_series": series,
        "alert_rule_test": [
            {"eval_time": "20m", "alertname": "ToolfleetNoWorkersForQueue", "exp_alerts": expected}
        ],
    }


def test_a_removed_extensions_queue_leaves_the_exporter_and_stops_the_no_workers_alert(
    redis_url: str, ns: str, fleets: list[Fleet], tmp_path: Path
) -> None:
    """A fleet serving the `gone` extension restarts without it: right after the stop the
    exporter shows its queue with 0 workers (the alert would page, checked by promtool);
    within one TTL the queue leaves the exporter, and promtool evaluating the exporter's
    series pages for no queue."""
    promtool = _promtool()
    fleets.append(_fleet(redis_url, ns, tmp_path / "a.log", "gone"))
    exporter = Exporter(redis_url, ns, tmp_path / "exporter.log")
    try:
        _eventually(lambda: _exporter_queues(exporter).get("tools.gone") == 1, 30, "gone live")
        stopping = fleets.pop()
        stopping.process.send_signal(signal.SIGTERM)  # its workers withdraw, then drain
        _eventually(lambda: _exporter_queues(exporter).get("tools.gone") == 0, 30, "no worker")
        unserved = _samples(exporter.port)
        stopping.stop()
        fleets.append(_fleet(redis_url, ns, tmp_path / "b.log"))  # the same fleet without it
        stopped = time.monotonic()
        _eventually(lambda: "tools.gone" not in _exporter_queues(exporter),
                    TTL_S + MARGIN_S, "the removed queue left the exporter")  # fmt: skip
        print(f"removed queue left the exporter {time.monotonic() - stopped:.2f} s after restart")
        removed = _samples(exporter.port)
        assert _exporter_queues(exporter).get("tools.fleet-test") == 1
    finally:
        assert exporter.stop() == 0
    (tmp_path / "alerts.yml").write_text(ALERTS.read_text())
    tests = {
        "rule_files": ["alerts.yml"],
        "evaluation_interval": "1m",
        "tests": [
            _alert_test(unserved, list(WATCHED)),
            _alert_test(removed, []),
        ],
    }
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    done = subprocess.run([promtool, "test", "rules", "tests.yml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def _reply(r: redis.Redis, reply_to: str) -> dict[str, Any]:
    popped = r.blpop([reply_to], timeout=30)
    assert popped is not None, "no reply"
    envelope = ReplyEnvelope.decode(popped[1])
    assert envelope.result is not None
    return envelope.result.model_dump(mode="json")


def test_two_fleets_exporting_one_name_keep_it_for_the_first_tool_and_report_the_collision(
    redis_url: str, ns: str, fleets: list[Fleet], tmp_path: Path
) -> None:
    """Fleet A serves a/b_c, then fleet B serves a-b/c, both ext_a_b_c: the name stays A's
    (listed once, as a/b_c); B's collision is in client.extension_errors(), `extensions
    check`, B's toolfleet_catalog_collisions metric and the events stream; 50 calls to the
    listed name all reach a/b_c; a call put on B's queue by hand is refused by B, with or
    without the identity it was listed with."""
    fleets.append(_fleet(redis_url, ns, tmp_path / "a.log", "a"))
    client = Either("sync", redis_url, namespace=ns, settings=_settings())
    r = redis.Redis.from_url(redis_url)
    try:
        _eventually(lambda: SHARED in _listed(client), 30, "fleet A's tool listed")
        port = _free_port()
        fleets.append(_fleet(redis_url, ns, tmp_path / "b.log", "a_b",
                             env={"TOOLFLEET_METRICS_PORT": str(port)}))  # fmt: skip

        # Then: reported wherever an operator looks.
        _eventually(lambda: any(SHARED in k for k in client.client.extension_errors()), 30,
                    "the collision in extension_errors()")  # fmt: skip
        (problem,) = [v for k, v in client.client.extension_errors().items() if SHARED in k]
        assert "a/b_c" in problem and "a-b/c" in problem, problem
        check = subprocess.run(
            [toolfleet_command(), "extensions", "check", "--no-entry-points"],
            capture_output=True, text=True, env=_env(redis_url, ns), timeout=120, check=False,
        )  # fmt: skip
        assert check.returncode == 1 and SHARED in check.stdout, check.stdout + check.stderr
        collisions = {dict(labels).get("function"): value
                      for (name, labels), value in _samples(port).items()
                      if name == "toolfleet_catalog_collisions"}  # fmt: skip
        assert collisions == {SHARED: 1.0}
        events = [codec.loads(fields[b"event"]) for _, fields in r.xrange(events_key(ns))]
        kinds = [(e.get("kind"), e.get("function"), e.get("owner"), e.get("refused"))
                 for e in events]  # fmt: skip
        assert ("collision", SHARED, "a/b_c", "a-b/c") in kinds

        # And: the name is listed once, for a/b_c, and every call reaches it.
        entries = [t for t in client.tools(format="anthropic") if t["name"] == SHARED]
        assert len(entries) == 1
        answers = [client.submit(SHARED, {}, timeout_s=30) for _ in range(50)]
        reached = [client.result(future).content for future in answers]
        assert reached == ["a/b_c@1.0.0"] * 50

        # And: a call on B's queue (a misrouted message) never runs B's tool.
        for identity in ("a/b_c", None):
            reply_to = f"{ns}:reply:test-{uuid.uuid4().hex[:6]}"
            request = ToolCallRequest(id=new_call_id(), function=SHARED, arguments={},
                                      reply_to=reply_to, deadline=time.time() + 30,
                                      timeout_s=30, identity=identity)  # fmt: skip
            enqueue_raw(r, ns, request.encode().decode(), queue="tools.a-b")
            result = _reply(r, reply_to)
            assert result["status"] == "not_available", result
            assert "a/b_c" in result["content"]["error"], result
    finally:
        client.stop()
        r.close()


def test_a_call_pinned_to_the_schema_it_was_shown_is_refused_after_the_schema_changed(
    redis_url: str, ns: str, fleets: list[Fleet], tmp_path: Path
) -> None:
    """The exports carry each tool's schema hash (MCP _meta; metadata=True for the
    others); a call pinned to it runs; after an upgrade that changed the schema, the same
    pin is refused not_available with "list tools again" by both clients and through the
    gateway, without running, while an unpinned call and the new hash run."""
    fleets.append(_fleet(redis_url, ns, tmp_path / "v1.log", "ren_v1"))
    clients = [Either(kind, redis_url, namespace=ns, settings=_settings())
               for kind in ("sync", "async")]  # fmt: skip
    gateway: GatewayProbe | None = None
    try:
        for client in clients:
            _eventually(lambda c=client: MEASURE in _listed(c), 30, "measure listed")
        (tool,) = [t for t in clients[0].tools(metadata=True) if t["function"]["name"] == MEASURE]
        shown = tool["metadata"][SCHEMA_HASH_KEY]
        (anthropic,) = [t for t in clients[1].tools(format="anthropic", metadata=True)
                        if t["name"] == MEASURE]  # fmt: skip
        assert anthropic["metadata"] == {SCHEMA_HASH_KEY: shown}
        assert "metadata" not in next(t for t in clients[0].tools() if t["function"]["name"]
                                      == MEASURE)  # fmt: skip
        for client in clients:
            assert client.call(MEASURE, {"size": 1}, schema_hash=shown).content == (
                "ren/measure@1.0.0"
            )

        # When: version 2 changes the tool's schema.
        fleets.pop().stop()
        fleets.append(_fleet(redis_url, ns, tmp_path / "v2.log", "ren_v2"))
        gateway = GatewayProbe(redis_url, ns)
        now_shown = gateway.tools()[MEASURE].meta or {}
        assert now_shown.get(SCHEMA_HASH_KEY) not in (None, shown), now_shown

        # Then: the old pin is refused before running, the new one and no pin run.
        for client in clients:
            refused = client.call(MEASURE, {"size": 1}, schema_hash=shown)
            assert refused.status is Status.NOT_AVAILABLE, refused
            assert "list tools again" in refused.content["error"], refused
            assert refused.run_s is None
            pinned = client.call(MEASURE, {"size": 1}, schema_hash=now_shown[SCHEMA_HASH_KEY])
            assert pinned.content == "ren/measure@2.0.0"
            assert client.call(MEASURE, {"size": 1}).content == "ren/measure@2.0.0"

        async def pinned_call(session: Client) -> types.CallToolResult:
            return await session.call_tool(MEASURE, {"size": 1}, meta={SCHEMA_HASH_KEY: shown})

        through_gateway = gateway.do(pinned_call)
        assert through_gateway.is_error
        (block,) = through_gateway.content
        assert isinstance(block, types.TextContent) and "list tools again" in block.text
    finally:
        if gateway is not None:
            gateway.close()
        for client in clients:
            client.stop()


def test_a_call_pinned_to_the_old_schema_is_served_by_an_old_worker_during_a_rolling_upgrade(
    redis_url: str, ns: str, fleets: list[Fleet], tmp_path: Path
) -> None:
    """Two fleets of two versions of one extension consume one queue, each version with
    its own schema of ``measure``. Calls pinned to either schema are all served, each by a
    worker of its version (a worker of the other hands the call back); once no worker
    serves the old schema, a call pinned to it is refused not_available, "list tools
    again", without running."""
    fleets.append(_fleet(redis_url, ns, tmp_path / "v1.log", "ren_v1"))
    with ToolClient(redis_url, namespace=ns, settings=_settings()) as client:
        _eventually(lambda: MEASURE in {t["function"]["name"] for t in client.tools()}, 30,
                    "measure listed")  # fmt: skip
        old = _schema_hash(client)
        fleets.append(_fleet(redis_url, ns, tmp_path / "v2.log", "ren_v2"))
        _eventually(lambda: _schema_hash(client) != old, 30, "version 2 published")
        new = _schema_hash(client)
        time.sleep(3 * 0.5)  # a few heartbeats: each version has seen the other's schema

        # Then: while both versions run, every pinned call is served by its own version.
        pinned = [(old, "1.0.0"), (new, "2.0.0")] * 10
        futures = [client.submit(MEASURE, {"size": 1}, schema_hash=h, timeout_s=30)
                   for h, _ in pinned]  # fmt: skip
        results = [f.result() for f in futures]
        for (_, version), result in zip(pinned, results, strict=True):
            assert result.status is Status.OK, result
            assert result.content == f"ren/measure@{version}", result

        # When: the last worker of version 1 stops.
        fleets.pop(0).stop()

        # Then: a call pinned to the old schema is refused unrun, saying what to do.
        def refused() -> bool:
            result = client.call(MEASURE, {"size": 1}, schema_hash=old, timeout_s=30)
            if result.status is Status.OK:
                assert result.content == "ren/measure@1.0.0", result  # still draining
                return False
            assert result.status is Status.NOT_AVAILABLE and result.run_s is None, result
            assert "list tools again" in result.content["error"], result
            assert f"schema {old} was listed" in result.content["error"], result
            return True

        _eventually(refused, TTL_S + MARGIN_S, "the old pin refused")
        again = client.call(MEASURE, {"size": 1}, schema_hash=new, timeout_s=30)
        assert again.content == "ren/measure@2.0.0", again


def _schema_hash(client: ToolClient) -> str:
    (tool,) = [t for t in client.tools(metadata=True) if t["function"]["name"] == MEASURE]
    return str(tool["metadata"][SCHEMA_HASH_KEY])


def _publish(r: redis.Redis, ns: str, now: float, worker: str, *named: tuple[str, str]) -> Any:
    """Run the publish script as a worker serving ``named`` (name, identity) would, each
    name with the schema hash ``h-<identity>``."""
    keys = [catalog_key(ns), catalog_live_key(ns), catalog_owners_key(ns)]
    keys += [catalog_workers_key(ns, name) for name, _ in named]
    keys += [catalog_schemas_key(ns, name) for name, _ in named]
    args: list[Any] = [repr(now), repr(now - TTL_S), worker, 60_000]
    for name, identity in named:
        entry = codec.dumps({"name": name, "queue": "q", "by": identity})
        args += [name, identity, entry, f"h-{identity}"]
    return r.eval(PUBLISH_SCRIPT, len(keys), *keys, *args)


def test_the_publish_script_gives_the_schemas_the_live_workers_serve(
    r: redis.Redis, ns: str
) -> None:
    """Two workers serving two schemas of one name each get both back while both beat;
    one TTL after a worker's last beat its schema is gone from what the other gets."""
    one = _publish(r, ns, 1000.0, "w1", (SHARED, "a/b_c"), ("ext_other", "o/t"))
    assert live_schemas(one[3]) == {SHARED: {"h-a/b_c"}, "ext_other": {"h-o/t"}}
    both = r.eval(  # w2 serves the same tool under another schema (a new version)
        PUBLISH_SCRIPT, 5, catalog_key(ns), catalog_live_key(ns), catalog_owners_key(ns),
        catalog_workers_key(ns, SHARED), catalog_schemas_key(ns, SHARED),
        repr(1001.0), repr(1001.0 - TTL_S), "w2", 60_000, SHARED, "a/b_c", b"{}", "h-v2",
    )  # fmt: skip
    assert live_schemas(both[3]) == {SHARED: {"h-a/b_c", "h-v2"}}
    later = _publish(r, ns, 1000.0 + TTL_S + 0.5, "w2")
    assert later[3] == []
    alone = r.eval(
        PUBLISH_SCRIPT, 5, catalog_key(ns), catalog_live_key(ns), catalog_owners_key(ns),
        catalog_workers_key(ns, SHARED), catalog_schemas_key(ns, SHARED),
        repr(1000.0 + TTL_S + 0.5), repr(1000.5), "w2", 60_000, SHARED, "a/b_c", b"{}", "h-v2",
    )  # fmt: skip
    assert live_schemas(alone[3]) == {SHARED: {"h-v2"}}


def test_the_publish_script_keeps_a_name_for_its_first_tool_until_its_workers_are_gone(
    r: redis.Redis, ns: str
) -> None:
    """A second tool is refused a name the first one's live workers hold; the first one's
    beats keep it; one TTL after its last beat the name is deleted (entry, owner,
    liveness) by the next beat of any worker, and the second tool may take it."""
    first = _publish(r, ns, 1000.0, "w1", (SHARED, "a/b_c"))
    assert first == [[], [], [SHARED.encode()], [[SHARED.encode(), b"h-a/b_c w1"]]]
    refused = _publish(r, ns, 1001.0, "w2", (SHARED, "a-b/c"))
    assert refused[0] == [SHARED.encode(), b"a/b_c"]
    assert codec.loads(r.hget(catalog_key(ns), SHARED))["by"] == "a/b_c"
    assert _publish(r, ns, 1002.0, "w1", (SHARED, "a/b_c"))[0] == []
    # w1 stops; one TTL after its last beat a beat of an unrelated worker deletes the name
    assert _publish(r, ns, 1002.0 + TTL_S + 0.01, "w3")[1] == [SHARED.encode()]
    assert not r.hexists(catalog_key(ns), SHARED) and not r.hexists(catalog_owners_key(ns), SHARED)
    taken = _publish(r, ns, 1006.0, "w2", (SHARED, "a-b/c"))
    assert taken[0] == [] and codec.loads(r.hget(catalog_key(ns), SHARED))["by"] == "a-b/c"
