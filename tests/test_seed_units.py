"""Unit rules behind the seed shapes: Toolkit.export, partial arguments, affinity routes."""

from __future__ import annotations

import time

import pytest

from toolfleet.producer.affinity import Routes
from toolfleet.producer.catalog import Catalog
from toolfleet.shared import CallContext, Status, ToolCallRequest, ToolCallResult
from toolfleet.shared.preparing import partial_arguments, preparation_text
from toolfleet.shared.toolkit import Toolkit

PARAMETERS = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def _kit() -> Toolkit:
    kit = Toolkit()
    kit.deftool("double", "Double a number.", PARAMETERS, lambda a: 2 * a)
    return kit


def test_toolkit_export_lists_its_tools_in_any_format() -> None:
    """Toolkit.export renders its deftools; with a slug they carry the fleet's names."""
    (openai,) = _kit().export()
    assert openai == {
        "type": "function",
        "function": {"name": "double", "description": "Double a number.", "parameters": PARAMETERS},
    }
    (strict,) = _kit().export("openai-strict", slug="math-kit")
    assert strict["function"]["name"] == "ext_math_kit_double"
    assert strict["function"]["strict"] is True
    assert strict["function"]["parameters"]["additionalProperties"] is False
    (anthropic,) = _kit().export(format="anthropic")
    assert anthropic["input_schema"] == PARAMETERS
    with pytest.raises(ValueError, match="unknown tool format"):
        _kit().export("yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"city": "Par', {"city": "Par"}),
        ('{"city": "Paris", "da', {"city": "Paris"}),
        ('{"city": "Paris", "days": 3', {"city": "Paris", "days": 3}),
        ('{"a": [1, {"b": "x', {"a": [1, {"b": "x"}]}),
        ('{"q": "say \\"hi', {"q": 'say "hi'}),
        ("", {}),
        ("[1, 2", {}),
        (None, {}),
    ],
)
def test_partial_arguments_keep_what_is_complete(text: str | None, expected: dict) -> None:
    """An incomplete JSON object yields its members so far; a cut string up to its cut."""
    assert partial_arguments(text) == expected


def test_preparation_text_fills_placeholders_and_leaves_odd_braces() -> None:
    """{name} takes the partial value (JSON for non-strings), … until it arrives."""
    template = "Forecast for {city}, {days} days"
    assert preparation_text(template, "{") == "Forecast for …, … days"
    assert preparation_text(template, '{"city": "Oslo", "days": 2') == "Forecast for Oslo, 2 days"
    assert preparation_text("odd { brace", "{}") == "odd { brace"
    assert preparation_text(None, "{}") is None


def _catalog(live: set[str], checked: set[str]) -> Catalog:
    entry = {"name": "ext_python_run", "queue": "tools.python", "affinity": "conversation"}
    return Catalog(
        entries={"ext_python_run": entry},
        live_queues=frozenset(live),
        read_at=time.monotonic(),
        queue_lengths={q: 0 for q in checked},
    )


def _request(conversation: str | None) -> ToolCallRequest:
    return ToolCallRequest(
        id="r1",
        function="ext_python_run",
        context=CallContext(account="acme", conversation=conversation),
        reply_to="x",
        deadline=time.time() + 5,
        timeout_s=5,
    )


def _result(route: str | None, worker: str | None = "h:1") -> ToolCallResult:
    return ToolCallResult(
        id="r1", function="ext_python_run", status=Status.OK, worker=worker, route=route
    )


def test_routes_follow_a_live_slot_and_fall_back_when_it_is_gone() -> None:
    """A learned route is used while live (or not yet checked); a dead one falls back for good."""
    routes = Routes()
    slot = "tools.python.slot.h-1-0"
    request = _request("c1")
    assert routes.route(request, _catalog({"tools.python"}, {"tools.python"}), "tools.python") == (
        "tools.python"
    )
    routes.learn(request, _result(slot))
    assert routes.queues() == {slot}
    assert routes.route(request, _catalog(set(), set()), "tools.python") == slot  # unchecked
    assert routes.route(request, _catalog({slot}, {slot}), "tools.python") == slot
    assert routes.route(request, _catalog(set(), {slot}), "tools.python") == "tools.python"
    assert routes.queues() == set()
    assert routes.route(request, _catalog({slot}, {slot}), "tools.python") == "tools.python"


def test_routes_ignore_calls_without_a_conversation_and_local_results() -> None:
    """No conversation, no route; a producer-made result (no worker) keeps the route."""
    routes = Routes()
    routes.learn(_request(None), _result("tools.python.slot.h-1-0"))
    assert routes.queues() == set()
    request = _request("c2")
    routes.learn(request, _result("tools.python.slot.h-1-0"))
    routes.learn(request, _result(None, worker=None))
    assert routes.queues() == {"tools.python.slot.h-1-0"}
    routes.learn(request, _result(None, worker="h:2"))
    assert routes.queues() == set()


def test_routes_forget_the_least_recent_conversation_beyond_the_bound() -> None:
    """The memory is bounded: the oldest conversation's route goes first."""
    routes = Routes(max_conversations=2)
    for n in range(3):
        routes.learn(_request(f"c{n}"), _result(f"tools.python.slot.s-{n}"))
    assert routes.queues() == {"tools.python.slot.s-1", "tools.python.slot.s-2"}
