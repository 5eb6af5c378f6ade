"""Function, queue and key names."""

from __future__ import annotations

import uuid
from pathlib import Path

from conftest import start_fleet
from toolfleet.producer import ToolClient
from toolfleet.shared import Status
from toolfleet.shared.naming import (
    FUNCTION_NAME_RE,
    actor_name_for,
    default_queue_for,
    function_name,
)


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
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """A worker serving queues tools.a-b and tools.a_b answers the calls of both, each by
    its own extension."""
    extra = ["--extension", "queue_names_ext:dash", "--extension", "queue_names_ext:underscore"]
    ns = f"{namespace}-q-{uuid.uuid4().hex[:6]}"
    fleet = start_fleet(redis_url, ns, tmp_path / "worker.log", processes=1, extra=extra)
    try:
        with ToolClient(redis_url, namespace=ns) as client:
            dash = client.call("ext_a_b_dash", {}, timeout_s=30)
            underscore = client.call("ext_a_b_underscore", {}, timeout_s=30)
        assert (dash.status, dash.content) == (Status.OK, "a-b"), dash
        assert (underscore.status, underscore.content) == (Status.OK, "a_b"), underscore
    finally:
        fleet.stop()
