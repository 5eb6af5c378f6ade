"""Function, queue and key names."""

from __future__ import annotations

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
    assert actor_name_for("tools.a-b") != actor_name_for("tools.c")
