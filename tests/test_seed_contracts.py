"""The seed systems' tool shapes, each written as that system writes it, through a real fleet.

- RAGFlow: a plugin file on ``plugin.llm_tool_plugin.LLMToolPlugin`` (RAGFlow's older
  module path) or ``agent.plugin.llm_tool_plugin.LLMToolPlugin`` (its current one) loads
  unchanged; its
  display fields reach the catalog and ``client.tools(format="display")``; a ``number``
  keeps integers (``"103"``, not ``"103.0"``); ``llm_tool_metadata_to_openai_tool``.
- Smarter: an extension declared in ``[tool.smarter]`` loads; ``tool_requested`` and
  ``tool_responded`` fire in the calling application's process.
- multi-llm-ts: ``isEnabled() == False`` is neither offered nor run (re-evaluated at
  catalog refresh); a preparation description from partial arguments; the canceled
  description reaches a streaming caller.
- The tutorial's REPL: a conversation keeps its variables across 12 follow-up calls on a
  2-process fleet, and falls back to a fresh interpreter with a hint when its worker dies.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_python_tool import _load_python

from conftest import TESTS, Fleet, require_sandbox, start_fleet
from toolfleet.producer import AsyncToolClient, ToolClient
from toolfleet.shared import Status
from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.manifest import read_manifest
from toolfleet.shared.signals import tool_requested, tool_responded

SEEDS = TESTS / "seed_shapes"
RAGFLOW = "ext_ragflow_seed_offset_adder"
RAGFLOW_AGENT = "ext_ragflow_agent_seed_scaled_adder"
SHOUT = "ext_smarter_seed_shout"
WEATHER = "ext_mllm_seed_weather"
PYTHON = "ext_python_run"


@pytest.fixture(scope="module")
def flags(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("seed-flags")
    return {"flag": folder / "weather-enabled", "runs": folder / "weather-runs"}


@pytest.fixture(scope="module")
def seed_fleet(
    redis_url: str,
    namespace: str,
    tmp_path_factory: pytest.TempPathFactory,
    flags: dict[str, Path],
) -> Iterator[Fleet]:
    """One worker process with the RAGFlow folders (both module paths), the Smarter folder
    and the multi-llm tool."""
    names = ("ragflow_plugin", "ragflow_agent_plugin", "smarter_ext")
    folders = os.pathsep.join(str(SEEDS / name) for name in names)
    fleet = start_fleet(
        redis_url,
        f"{namespace}-seed-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("seed") / "worker.log",
        processes=1,
        extra=["--extension", "seed_shapes.multi_llm:extension"],
        env={
            "TOOLFLEET_EXTENSION_PATHS": folders,
            "TFTEST_WEATHER_FLAG": str(flags["flag"]),
            "TFTEST_WEATHER_RUNS": str(flags["runs"]),
        },
    )
    yield fleet
    fleet.stop()


@pytest.fixture
def seed_client(seed_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(seed_fleet.redis_url, namespace=seed_fleet.namespace) as client:
        yield client


def _wait_for(predicate: Any, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


# --- RAGFlow ---------------------------------------------------------------------------------


def test_ragflow_plugin_file_loads_unchanged_and_keeps_integers(seed_client: ToolClient) -> None:
    """A RAGFlow plugin file serves as written: 1 + 2 + 100 is "103", as RAGFlow returns it."""
    result = seed_client.call(RAGFLOW, {"a": 1, "b": 2})
    assert result.status is Status.OK, result
    assert result.content == "103"
    assert seed_client.call(RAGFLOW, '{"a": 1.5, "b": 2}').content == "103.5"


def test_a_plugin_file_on_ragflows_current_module_path_loads_unchanged(
    seed_client: ToolClient, seed_fleet: Fleet
) -> None:
    """A plugin file importing ``agent.plugin.llm_tool_plugin`` serves beside one importing
    ``plugin.llm_tool_plugin``, in the same worker: (1 + 2) * 10 is "30"."""
    result = seed_client.call(RAGFLOW_AGENT, {"a": 1, "b": 2})
    assert result.status is Status.OK, result
    assert result.content == "30"
    assert seed_client.call(RAGFLOW, {"a": 1, "b": 2}).content == "103"
    assert "ragflow_agent_plugin" not in seed_fleet.log()  # no load problem reported
    (shown,) = [t for t in seed_client.tools(format="display") if t["name"] == RAGFLOW_AGENT]
    assert shown["display_name"] == "$t:scaled_adder.name"


def test_both_ragflow_module_paths_name_one_base_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """Named alone, a plugin on either path becomes an extension; both paths give the same
    ``LLMToolPlugin``, so a plugin file may import either."""
    from toolfleet.worker.registry.loader import load_spec

    monkeypatch.syspath_prepend(str(SEEDS / "ragflow_agent_plugin"))
    extension = load_spec("scaled_adder:ScaledAdderPlugin")
    assert (extension.slug, extension.version) == ("scaled_adder", "1.0.0")
    (spec,) = extension.validate()
    assert extension.function_name(spec.name) == "ext_scaled_adder_scaled_adder"
    import agent.plugin.llm_tool_plugin as current  # type: ignore[import-not-found]
    import plugin.llm_tool_plugin as older  # type: ignore[import-not-found]

    assert current.LLMToolPlugin is older.LLMToolPlugin


def test_ragflow_display_fields_reach_the_catalog_and_a_display_listing(
    seed_client: ToolClient, seed_fleet: Fleet
) -> None:
    """displayName and displayDescription (tool and parameters) are listed for UIs, not models."""
    (shown,) = [t for t in seed_client.tools(format="display") if t["name"] == RAGFLOW]
    assert shown["display_name"] == "$t:offset_adder.name"
    assert shown["display_description"] == "$t:offset_adder.description"
    assert shown["description"] == "Add two numbers, then add 100 to the sum."
    assert shown["parameters"] == [
        {"name": "a", "type": "number", "description": "The first number",
         "display_description": "$t:offset_adder.params.a", "required": True},
        {"name": "b", "type": "number", "description": "The second number",
         "display_description": "$t:offset_adder.params.b", "required": True},
    ]  # fmt: skip
    for fmt in ("openai", "openai-strict", "anthropic", "mcp", "responses"):
        (tool,) = [t for t in seed_client.tools(format=fmt) if RAGFLOW in repr(t)]
        assert "params.a" not in repr(tool) and "offset_adder.description" not in repr(tool)


def test_llm_tool_metadata_to_openai_tool_matches_the_fleets_export(
    seed_client: ToolClient,
) -> None:
    """RAGFlow's helper gives the plugin's OpenAI tool; the fleet exports the same schema."""
    sys.path.insert(0, str(SEEDS / "ragflow_plugin"))
    try:
        from toolfleet.shared.ragflow import install_import_alias, llm_tool_metadata_to_openai_tool

        assert install_import_alias()
        from offset_adder import OffsetAdderPlugin  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(SEEDS / "ragflow_plugin"))
    tool = llm_tool_metadata_to_openai_tool(OffsetAdderPlugin.get_metadata())
    assert tool["type"] == "function"
    assert tool["function"]["name"] == "offset_adder"
    assert tool["function"]["parameters"] == {
        "type": "object",
        "properties": {
            "a": {"type": "number", "description": "The first number"},
            "b": {"type": "number", "description": "The second number"},
        },
        "required": ["a", "b"],
    }
    (served,) = [t for t in seed_client.tools() if t["function"]["name"] == RAGFLOW]
    assert served["function"]["parameters"] == tool["function"]["parameters"]


# --- Smarter ---------------------------------------------------------------------------------


def test_smarter_extension_declared_in_tool_smarter_loads_and_serves(
    seed_client: ToolClient,
) -> None:
    """A folder whose pyproject has only [tool.smarter] is an extension like [tool.toolfleet]."""
    result = seed_client.call(SHOUT, {"text": "hello"})
    assert result.status is Status.OK, result
    assert result.content == "HELLO"


def test_tool_smarter_beside_tool_toolfleet_is_refused_with_a_clear_problem(
    tmp_path: Path,
) -> None:
    """Both tables in one pyproject: which one is meant? The manifest is refused, naming both."""
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(
        '[tool.toolfleet]\nslug = "a"\nversion = "1"\n[tool.smarter]\nslug = "b"\nversion = "1"\n'
    )
    with pytest.raises(ConfigurationError, match=r"both \[tool.toolfleet\] and \[tool.smarter\]"):
        read_manifest(pyproject)


def test_lifecycle_signals_fire_in_the_producer_process(seed_client: ToolClient) -> None:
    """tool_requested when the call is handed over, tool_responded when its result arrives."""
    seen: list[tuple[str, dict[str, Any]]] = []

    def on_requested(sender: str, **event: Any) -> None:
        seen.append(("requested", event))

    def on_responded(sender: str, **event: Any) -> None:
        seen.append(("responded", event))

    tool_requested.connect(on_requested)
    tool_responded.connect(on_responded)
    try:
        result = seed_client.call(SHOUT, {"text": "x"}, context={"account": "acme"})
    finally:
        tool_requested.disconnect(on_requested)
        tool_responded.disconnect(on_responded)
    mine = [(kind, e) for kind, e in seen if e.get("id") == result.id]
    assert [kind for kind, _ in mine] == ["requested", "responded"]
    requested, responded = mine[0][1], mine[1][1]
    assert requested["side"] == responded["side"] == "producer"
    assert requested["function"] == SHOUT and requested["account"] == "acme"
    assert responded["status"] == "ok" and responded["worker"] == result.worker
    assert requested["arguments"] == responded["result"] == "[redacted]"


# --- multi-llm-ts ------------------------------------------------------------------------------


def test_is_enabled_false_is_not_offered_not_run_and_re_evaluated(
    seed_client: ToolClient, flags: dict[str, Path]
) -> None:
    """isEnabled() == False: absent from tools(), refused, never run; true again: served."""
    flags["flag"].unlink(missing_ok=True)
    _wait_for(lambda: WEATHER not in {t["function"]["name"] for t in seed_client.tools()})
    refused = seed_client.call(WEATHER, {"city": "Paris"})
    assert refused.status is Status.NOT_AVAILABLE, refused
    assert "disabled" in refused.content["error"]
    assert not flags["runs"].exists() or "Paris" not in flags["runs"].read_text()

    flags["flag"].touch()
    _wait_for(lambda: WEATHER in {t["function"]["name"] for t in seed_client.tools()})
    served = seed_client.call(WEATHER, {"city": "Lyon"})
    assert served.status is Status.OK and served.content == "sunny in Lyon for 1 day(s)"
    assert "Lyon" in flags["runs"].read_text()


def test_preparation_description_from_partial_arguments(
    seed_client: ToolClient, flags: dict[str, Path]
) -> None:
    """While the model writes the call, preparing() fills the description from what came so far."""
    flags["flag"].touch()
    _wait_for(lambda: WEATHER in {t["function"]["name"] for t in seed_client.tools()})
    early = seed_client.preparing(WEATHER, '{"ci', tool_call_id="call_7")
    assert early.kind == "preparing" and early.tool_call_id == "call_7"
    assert early.description == "Preparing the forecast for …"
    later = seed_client.preparing(WEATHER, '{"city": "Par')
    assert later.description == "Preparing the forecast for Par"
    assert seed_client.preparing("ext_no_such_tool", "{").description is None
    (shown,) = [t for t in seed_client.tools(format="display") if t["name"] == WEATHER]
    assert shown["preparation"] == "Preparing the forecast for {city}"


def test_canceled_description_reaches_the_streaming_caller(
    seed_fleet: Fleet, flags: dict[str, Path]
) -> None:
    """A streamed call canceled by its caller ends with the tool's canceled description."""
    flags["flag"].touch()

    async def scenario() -> list[Any]:
        async with AsyncToolClient(seed_fleet.redis_url, namespace=seed_fleet.namespace) as client:
            events = []
            function = {"name": WEATHER, "arguments": '{"city": "Slowtown"}'}
            calls = [{"id": "call_1", "type": "function", "function": function}]
            async for event in client.stream(calls, timeout_s=20):
                events.append(event)
                if event.kind == "running":
                    await client.cancel(event.call_id)
            return events

    _wait_for(lambda: flags["flag"].exists())
    events = asyncio.run(scenario())
    kinds = [e.kind for e in events]
    assert kinds == ["queued", "running", "result"], kinds
    assert events[1].description == "Looking up the weather in Slowtown"
    assert events[-1].status is Status.CANCELED
    assert events[-1].description == "Weather lookup for Slowtown canceled"


def test_a_disabled_tool_is_refused_by_the_worker_too(
    flags: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that reaches a worker anyway is answered not_available and does not run."""
    sys.path.insert(0, str(TESTS))
    try:
        from seed_shapes.multi_llm import extension  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(TESTS))
    from toolfleet.testing import run_tool

    runs = flags["runs"].with_name("unit-runs")
    monkeypatch.setenv("TFTEST_WEATHER_FLAG", str(flags["flag"].with_name("never-there")))
    monkeypatch.setenv("TFTEST_WEATHER_RUNS", str(runs))
    result = run_tool(extension, WEATHER, {"city": "Oslo"})
    assert result.status is Status.NOT_AVAILABLE and "disabled" in str(result.content)
    assert not runs.exists()


# --- the tutorial's REPL across a fleet -------------------------------------------------------


@pytest.fixture(scope="module")
def repl_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes serving the python extension."""
    require_sandbox()
    fleet = start_fleet(
        redis_url,
        f"{namespace}-repl-{uuid.uuid4().hex[:6]}",
        tmp_path_factory.mktemp("repl") / "worker.log",
        processes=2,
        threads=4,
        extra=_load_python(),
    )
    yield fleet
    fleet.stop()


def test_repl_keeps_variables_across_12_follow_up_calls_on_2_processes(repl_fleet: Fleet) -> None:
    """Every follow-up call of a conversation reaches the interpreter holding its variables."""
    ctx = {"account": "acme", "conversation": f"conv-{uuid.uuid4().hex[:8]}"}
    with ToolClient(repl_fleet.redis_url, namespace=repl_fleet.namespace) as client:
        first = client.call(PYTHON, {"code": "x = 0"}, context=ctx, timeout_s=20)
        assert first.status is Status.OK and first.content["error"] is None, first
        assert first.route, "the reply names the worker slot to come back to"
        workers = set()
        for n in range(1, 13):
            result = client.call(PYTHON, {"code": "x += 1\nx"}, context=ctx, timeout_s=20)
            assert result.status is Status.OK, result
            assert result.content["error"] is None, (n, result.content)
            assert result.content["result"] == str(n)
            workers.add(result.worker)
        assert workers == {first.worker}
    assert repl_fleet.live_workers("tools.python") == 2


def test_repl_falls_back_to_a_fresh_interpreter_when_its_worker_dies(repl_fleet: Fleet) -> None:
    """Kill the process holding a conversation: its next call is answered, fresh, with a hint."""
    ctx = {"account": "acme", "conversation": f"conv-{uuid.uuid4().hex[:8]}"}
    with ToolClient(repl_fleet.redis_url, namespace=repl_fleet.namespace) as client:
        first = client.call(PYTHON, {"code": "y = 5"}, context=ctx)
        assert first.status is Status.OK, first
        holder = int(str(first.worker).rsplit(":", 1)[1])
        os.kill(holder, signal.SIGKILL)
        after = client.call(PYTHON, {"code": "y"}, context=ctx, timeout_s=30)
        assert after.status is Status.OK, after
        assert after.worker != first.worker
        assert after.content["error"].startswith("NameError")
        assert "fresh interpreter" in after.content["error"]
        again = client.call(PYTHON, {"code": "y = 6\ny"}, context=ctx, timeout_s=20)
        assert again.content["result"] == "6" and again.worker == after.worker
        repl_fleet.wait_ready()


def test_a_ragflow_plugin_file_named_alone_becomes_an_extension(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--extension offset_adder:OffsetAdderPlugin without a manifest: slug from the module."""
    from toolfleet.worker.registry.loader import load_spec

    monkeypatch.syspath_prepend(str(SEEDS / "ragflow_plugin"))
    extension = load_spec("offset_adder:OffsetAdderPlugin")
    assert (extension.slug, extension.version) == ("offset_adder", "1.0.0")
    (spec,) = extension.validate()
    assert extension.function_name(spec.name) == "ext_offset_adder_offset_adder"
    with pytest.raises(TypeError, match="not a toolfleet Extension"):
        load_spec("offset_adder:logging")


def test_calls_routed_to_a_gone_slot_are_handed_back_and_answered(repl_fleet: Fleet) -> None:
    """A call waiting on the queue of a slot whose heartbeats stopped is served by another."""
    import redis

    from toolfleet.producer.publish import Publisher
    from toolfleet.shared import CallContext, ToolCallRequest
    from toolfleet.shared.naming import affinity_queue_for, slots_key, workers_key
    from toolfleet.shared.wire import ReplyEnvelope, new_call_id

    client = redis.Redis.from_url(repl_fleet.redis_url, socket_timeout=40)
    ns = repl_fleet.namespace
    gone = affinity_queue_for("tools.python", "gone-host-1-0")
    reply_to = f"{ns}:reply:direct-{new_call_id()}"
    try:
        client.hset(slots_key(ns), gone, "tools.python")
        client.zadd(workers_key(ns, gone), {"gone-host:1": time.time() - 100})
        request = ToolCallRequest(
            id=new_call_id(),
            function=PYTHON,
            arguments={"code": "z"},
            context=CallContext(account="acme", conversation=f"conv-{uuid.uuid4().hex[:8]}"),
            reply_to=reply_to,
            deadline=time.time() + 30,
            timeout_s=30,
        )
        Publisher(client, ns).publish(gone, request)
        item = client.blpop([reply_to], timeout=30)
        assert item is not None, "the call was stranded on the gone slot's queue"
        envelope = ReplyEnvelope.decode(item[1])
        while envelope.type != "result":  # pragma: no cover - events are not asked for
            item = client.blpop([reply_to], timeout=30)
            assert item is not None
            envelope = ReplyEnvelope.decode(item[1])
        result = envelope.result
        assert result is not None and result.status is Status.OK, result
        assert (
            result.content["error"].startswith("NameError") and "fresh" in result.content["error"]
        )
        _wait_for(lambda: not client.hexists(slots_key(ns), gone))
        assert client.llen(f"{ns}:{gone}") == 0 and client.hlen(f"{ns}:{gone}.msgs") == 0
    finally:
        client.delete(reply_to, workers_key(ns, gone), f"{ns}:{gone}", f"{ns}:{gone}.msgs")
        client.hdel(slots_key(ns), gone)
        client.close()
