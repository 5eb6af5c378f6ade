"""Fit a JSON result to a byte budget, keeping its shape and saying what was cut.

A tool whose manifest says ``result_shaping = "truncate"`` and whose result is over its
budget (the call's ``max_result_bytes``, at most the worker's) is answered ``ok`` with
the result cut by :func:`shape`, and the result's ``shaped`` flag set:

- a list keeps its first items and ends with a marker item ``"… 9,812 more items"``;
- an object keeps every key whose value is small (a count, a cursor, a flag: what the
  model needs to ask for the next page) and cuts its large values (strings, lists,
  objects) in key order to share what is left; only when even that does not fit does
  it keep its first keys and get a marker key ``"…"`` whose value is ``"… 12 more keys"``;
- a string keeps its start and ends with ``"… (9,812 more characters)"``;
- containers inside are cut the same way, so the last item kept may itself be cut.

Lists stay lists and objects objects, so the model can still read the result and ask
for the next page. The encoded result (compact JSON, as :mod:`toolfleet.shared.codec`
writes it) is at most the budget.
"""

from __future__ import annotations

from typing import Any

from toolfleet.shared import codec

__all__ = ["MARKER_KEY", "MIN_BUDGET_BYTES", "shape"]

#: The key that says how many keys of an object were cut.
MARKER_KEY = "…"
#: The smallest budget a call may ask for, bytes (room for a marker and a little data).
MIN_BUDGET_BYTES = 64
#: Below this many bytes left, an item that does not fit whole is not cut to fit.
_MIN_PARTIAL = 24


def _size(value: Any) -> int:
    return len(codec.dumps(value))


def _items_marker(left: int) -> str:
    return f"… {left:,} more item{'' if left == 1 else 's'}"


def _keys_marker(left: int) -> str:
    return f"… {left:,} more key{'' if left == 1 else 's'}"


def _cut_string(text: str, budget: int) -> str | None:
    """The longest start of ``text`` that, with its marker, encodes in ``budget`` bytes."""
    if _size(text) <= budget:
        return text
    low, high = 0, len(text)
    best: str | None = None
    while low <= high:  # binary search on the characters kept
        mid = (low + high) // 2
        candidate = f"{text[:mid]}… ({len(text) - mid:,} more characters)"
        if _size(candidate) <= budget:
            best, low = candidate, mid + 1
        else:
            high = mid - 1
    return best


def _fit(value: Any, budget: int) -> Any:
    """``value`` cut to encode in ``budget`` bytes, or ``_NOTHING`` when nothing fits."""
    if isinstance(value, str):
        cut = _cut_string(value, budget)
        return _NOTHING if cut is None else cut
    if isinstance(value, list):
        return _fit_list(value, budget)
    if isinstance(value, dict):
        return _fit_dict(value, budget)
    return value if _size(value) <= budget else _NOTHING


_NOTHING = object()


def _fit_list(items: list[Any], budget: int) -> Any:
    if _size(items) <= budget:
        return items
    kept: list[Any] = []
    used = 2  # "[" and "]"
    for index, item in enumerate(items):
        left = len(items) - index
        reserve = 1 + _size(_items_marker(left - 1)) if left > 1 else 0  # ",marker"
        comma = 1 if kept else 0
        size = _size(item)
        if used + comma + size + reserve <= budget:
            kept.append(item)
            used += comma + size
            continue
        room = budget - used - comma - (1 + _size(_items_marker(left - 1)) if left > 1 else 0)
        if room >= _MIN_PARTIAL and isinstance(item, (str, list, dict)):
            partial = _fit(item, room)
            if partial is not _NOTHING:
                kept.append(partial)
                used += comma + _size(partial)
                left -= 1
        if left:
            marker = _items_marker(left)
            if used + (1 if kept else 0) + _size(marker) > budget:
                return _NOTHING
            kept.append(marker)
        return kept
    return kept


#: A value encoding in at most this many bytes counts as small: it is kept whole.
_SMALL = 64


def _minimal(value: Any) -> Any:
    """The marker-only form of a large value (nothing of it kept but how much there was)."""
    if isinstance(value, list):
        return [_items_marker(len(value))]
    if isinstance(value, dict):
        return {MARKER_KEY: _keys_marker(len(value))}
    return f"… ({len(value):,} more characters)"


def _fit_dict(mapping: dict[str, Any], budget: int) -> Any:
    if _size(mapping) <= budget:
        return mapping
    large = {
        k for k, v in mapping.items() if isinstance(v, (str, list, dict)) and _size(v) > _SMALL
    }
    least = {k: (_minimal(v) if k in large else v) for k, v in mapping.items()}
    extra = budget - _size(least)
    if not large or extra < 0:
        return _fit_first_keys(mapping, budget)
    kept: dict[str, Any] = {}
    for key, value in mapping.items():
        if key not in large:
            kept[key] = value
            continue
        floor = _size(least[key])
        fitted = _fit(value, floor + extra)
        if fitted is _NOTHING:
            fitted = least[key]
        extra -= _size(fitted) - floor
        kept[key] = fitted
    return kept


def _fit_first_keys(mapping: dict[str, Any], budget: int) -> Any:
    kept: dict[str, Any] = {}
    used = 2  # "{" and "}"
    keys = list(mapping)
    marker_size = _size(MARKER_KEY) + 1  # "…": the key and its colon
    for index, key in enumerate(keys):
        left = len(keys) - index
        value = mapping[key]
        entry = _size(key) + 1 + _size(value)
        reserve = 1 + marker_size + _size(_keys_marker(left - 1)) if left > 1 else 0
        comma = 1 if kept else 0
        if used + comma + entry + reserve <= budget:
            kept[key] = value
            used += comma + entry
            continue
        tail = 1 + marker_size + _size(_keys_marker(left - 1)) if left > 1 else 0
        room = budget - used - comma - _size(key) - 1 - tail
        if room >= _MIN_PARTIAL and isinstance(value, (str, list, dict)):
            partial = _fit(value, room)
            if partial is not _NOTHING:
                kept[key] = partial
                used += comma + _size(key) + 1 + _size(partial)
                left -= 1
        if left:
            marker = _keys_marker(left)
            if used + (1 if kept else 0) + marker_size + _size(marker) > budget:
                return _NOTHING
            kept[MARKER_KEY] = marker
        return kept
    return kept


def shape(value: Any, budget_bytes: int) -> tuple[Any, bool]:
    """``value`` cut to encode in at most ``budget_bytes`` bytes, and whether it was cut.

    Args:
        value: a JSON value (what a tool returned, after scrubbing).
        budget_bytes: the most bytes its compact JSON encoding may take; at least
            :data:`MIN_BUDGET_BYTES` for anything to be kept.

    Returns:
        ``(value, False)`` when it fits; else ``(cut, True)``, the cut value encoding
        in at most ``budget_bytes`` bytes (see the module docstring for the markers).

    Raises:
        ValueError: nothing of ``value`` fits (a budget too small even for a marker, or
            a number longer than the budget).
    """
    if _size(value) <= budget_bytes:
        return value, False
    cut = _fit(value, budget_bytes)
    if cut is _NOTHING or _size(cut) > budget_bytes:
        raise ValueError(f"no part of the result fits in {budget_bytes} bytes")
    return cut, True
