"""The one nearest-name rule: which known names a mistyped or invented name was meant to be.

Used by the CLI for switch and function names (``toolfleet switch on ext_fleet_test_ad``)
and by the producer and worker for a call to a function the fleet does not serve
(``unknown function 'ext_bfcl_math_gdc'; did you mean 'ext_bfcl_math_gcd'?``).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = ["CUTOFF", "did_you_mean", "nearest_names"]

#: The least similarity (``difflib.SequenceMatcher.ratio``, 0 to 1) of a name offered.
CUTOFF = 0.6


def nearest_names(name: str, known: Iterable[str], n: int = 5) -> list[str]:
    """The at most ``n`` names of ``known`` closest to ``name``, closest first.

    The rule is :func:`difflib.get_close_matches` with a cutoff of :data:`CUTOFF`:
    names whose similarity ratio (twice the matching characters over the total) is at
    least 0.6. O(len(known)); only a name that was not found pays it.

    Args:
        name: the name asked for.
        known: the names that exist (function or switch names).
        n: the most names returned.
    """
    return difflib.get_close_matches(name, list(known), n=n, cutoff=CUTOFF)


def did_you_mean(name: str, known: Iterable[str], n: int = 3) -> str:
    """``"; did you mean 'a'?"`` (or ``'a' or 'b'``) for the names nearest ``name``, else ``""``."""
    nearest = nearest_names(name, known, n)
    if not nearest:
        return ""
    quoted = [repr(candidate) for candidate in nearest]
    if len(quoted) == 1:
        return f"; did you mean {quoted[0]}?"
    return f"; did you mean {', '.join(quoted[:-1])} or {quoted[-1]}?"
