"""Function, queue and key names."""

from __future__ import annotations

from toolfleet.shared import Status
from toolfleet.shared.naming import (
    FUNCTION_NAME_RE,
    actor_name_for,
    default_queue_for,
    function_name,
)
from toolfleet.testing import FleetFactory


def test_function_names_keep_case_and_replace_hyphens() -> None:
    """ext_<slug>_<tool>, hyphens to underscores, case kept."""
    assert function_name("date-calculator", "add-days") == "ext_date_calculator_add_days"
    assert function_name("bfcl", "maxPoints") == "ext_bfcl_maxPoints"


def test_long_names_are_cut_with_a_stable_hash() -> None:
    """Names over 64 characters are cut and hashed, deterministic and distinct."""
    a = function_name("x" * 40, "y" * 40)
    b = function_name("x" * 40, "y" * 39 + "z")
    assert len(a) == 64 and FUNCTION_NAME_RE.match(a)
    assert a == function_name("x" * 40, "y" * 40) and a != b


def test_queue_and_actor_names() -> None:
    """Queues are tools.<slug>; each queue has its own actor name."""
    assert default_queue_for("bfcl") == "tools.bfcl"
    queues = ["tools.a-b", "tools.a_b", "tools.a.b", "tools.c", "tools.a-b.slot.h-1-0"]
    assert len({actor_name_for(q) for q in queues}) == len(queues)


def test_queues_differing_in_dash_and_underscore_are_served_by_two_actors(
    toolfleet_fleet: FleetFactory,
) -> None:
    """A worker serving queues tools.a-b and tools.a_b answers the calls of both, each by
    its own extension."""
    fleet = toolfleet_fleet("queue_names_ext:dash", "queue_names_ext:underscore", processes=1)
    dash = fleet.client.call("ext_a_b_dash", {}, timeout_s=30)
    underscore = fleet.client.call("ext_a_b_underscore", {}, timeout_s=30)
    assert (dash.status, dash.content) == (Status.OK, "a-b"), dash
    assert (underscore.status, underscore.content) == (Status.OK, "a_b"), underscore
