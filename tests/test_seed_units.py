"""Unit rules behind the seed shapes: Toolkit.export, partial arguments, affinity routes."""

from __future__ import annotations

import time

import pytest

from toolfleet.producer.affinity import SlotWatch, route_key_of, routed, unchecked
from toolfleet.producer.catalog import Catalog
from toolfleet.shared import CallContext, ToolCallRequest
from toolfleet.shared.affinity import Route, decode_route, encode_route, session_lost_reason
from toolfleet.shared.naming import route_key
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


def test_a_route_is_followed_while_its_slot_is_live_and_names_its_holder_either_way() -> None:
    """A live slot gets the call; a dead one sends it to the tool's queue; both name the holder."""
    slot = "tools.python.slot.h-1-0"
    route = Route(slot, "h:1")
    request = _request("c1")
    queue, sent = routed(request, route, "tools.python", {slot})
    assert (queue, sent.session_holder) == (slot, "h:1")
    queue, sent = routed(request, route, "tools.python", {"tools.python"})
    assert (queue, sent.session_holder) == ("tools.python", "h:1")
    assert routed(request, None, "tools.python", {slot}) == ("tools.python", request)


def test_only_conversation_calls_to_tools_with_affinity_read_a_route() -> None:
    """No conversation, or a tool without affinity: no route key, so no Redis command."""
    catalog = _catalog(set(), set())
    assert route_key_of(_request(None), catalog, "ns") is None
    other = _request("c1").model_copy(update={"function": "ext_other_tool"})
    assert route_key_of(other, catalog, "ns") is None
    key = route_key_of(_request("c1"), catalog, "ns")
    assert key == route_key("ns", "acme", "c1", "ext_python_run")
    assert key != route_key("ns", "other", "c1", "ext_python_run")


def test_slots_the_catalog_has_not_read_are_checked_and_the_watch_is_bounded() -> None:
    """unchecked() lists slot queues the snapshot lacks; SlotWatch forgets the oldest."""
    catalog = _catalog({"tools.python.slot.a"}, {"tools.python.slot.a"})
    routes = [Route("tools.python.slot.a", "h:1"), Route("tools.python.slot.b", "h:2"), None]
    assert unchecked(routes, catalog) == ["tools.python.slot.b"]
    watch = SlotWatch(max_slots=2)
    watch.add(["s1", "s2"])
    watch.add(["s3"])
    assert watch.queues() == {"s2", "s3"}


def test_route_records_round_trip_and_bad_ones_are_no_route() -> None:
    """A record decodes to its route; anything else is no route (never an error)."""
    route = Route("tools.python.slot.h-1-0", "h:1")
    assert decode_route(encode_route(route)) == route
    for bad in (None, b"x", b"[]", b'{"queue": "q"}', b'{"queue": 1, "worker": "w"}'):
        assert decode_route(bad) is None


def test_a_session_is_lost_only_when_another_process_held_it() -> None:
    """The holder itself, or no known holder, has nothing to say; another process is gone."""
    assert session_lost_reason(None, "h:1") is None
    assert session_lost_reason("h:1", "h:1") is None
    assert session_lost_reason("h:1", "h:2") == "the worker process that held it (h:1) is gone"
