"""The one nearest-name rule the CLI, the producer and the worker share."""

from __future__ import annotations

from toolfleet.shared.catalog import CatalogEntry, refusal
from toolfleet.shared.manifest import Availability
from toolfleet.shared.nearest import did_you_mean, nearest_names

SERVED = ["ext_bfcl_math_gcd", "ext_bfcl_math_lcm", "ext_bfcl_math_factorial"]


def test_nearest_names_are_the_close_matches_closest_first() -> None:
    """A transposition finds the served name; an unrelated name finds nothing."""
    assert nearest_names("ext_bfcl_math_gdc", SERVED)[0] == "ext_bfcl_math_gcd"
    assert nearest_names("get_weather", SERVED) == []


def test_did_you_mean_quotes_one_or_several_names() -> None:
    """One name reads ``did you mean 'x'?``; several are joined with ``or``; none is empty."""
    assert did_you_mean("ext_bfcl_math_gdc", SERVED[:1]) == "; did you mean 'ext_bfcl_math_gcd'?"
    two = did_you_mean("ext_bfcl_math_gcm", SERVED[:2])
    assert two.startswith("; did you mean '") and "' or '" in two
    assert did_you_mean("get_weather", SERVED) == ""


def test_unknown_function_refusal_offers_only_what_the_account_may_call() -> None:
    """The unknown_function message names a near function only when the account may call it."""
    entry = CatalogEntry(
        name=SERVED[0], queue="tools.bfcl", availability=Availability(accounts_allowed=["acme"])
    )
    known = {SERVED[0]: entry}
    allowed = refusal("ext_bfcl_math_gdc", None, {}, "acme", known=known)
    refused = refusal("ext_bfcl_math_gdc", None, {}, "globex", known=known)
    assert allowed is not None and allowed.message.endswith("did you mean 'ext_bfcl_math_gcd'?")
    assert refused is not None and refused.message == "unknown function 'ext_bfcl_math_gdc'"
