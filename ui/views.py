"""What each page shows, from a :class:`~toolfleet.ui.snapshot.Snapshot`.

Template contexts, the switchable names, a call looked up by id, and the small
formatting filters.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from markupsafe import Markup, escape

from toolfleet.shared import codec, failures
from toolfleet.shared.naming import SLOT_INFIX, extension_switch, outcome_key
from toolfleet.ui.activity import WINDOW_MINUTES
from toolfleet.ui.snapshot import Failure, Snapshot, parse_failures

__all__ = [
    "FILTERS",
    "PAGES",
    "STATUS_ORDER",
    "Lookup",
    "context",
    "looks_like_call_id",
    "lookup_call",
    "search_failures",
    "sparkline",
    "switchable",
]

#: Page name -> its title, in the navigation's order.
PAGES = {
    "overview": "Overview",
    "workers": "Workers",
    "tenants": "Tenants and limits",
    "failures": "Failures",
    "switches": "Switches",
}

#: Statuses in the order the overview's columns show them.
STATUS_ORDER = (
    "ok", "tool_error", "invalid_arguments", "timeout", "crashed", "rejected",
    "not_available", "unknown_function", "expired", "canceled",
)  # fmt: skip

#: Most failures listed on the failures page.
FAILURES_SHOWN = 100

_CALL_ID = re.compile(r"^[0-9a-fA-F-]{32,36}$")


@dataclass(frozen=True)
class Lookup:
    """A call found by its id in the outcomes the fleet keeps (None fields: not found)."""

    call_id: str
    status: str | None = None
    function: str | None = None
    error: str | None = None
    worker: str | None = None


def looks_like_call_id(q: str) -> bool:
    """Whether ``q`` has the shape of a call id (a UUID)."""
    return bool(_CALL_ID.match(q))


def search_failures(client: redis.Redis, namespace: str | Sequence[str], q: str) -> list[Failure]:
    """Failed calls whose id, function or account holds ``q`` (any case), newest first.

    From the whole failures index (:func:`toolfleet.shared.failures.search`).
    """
    prefixes = [namespace] if isinstance(namespace, str) else list(namespace)
    return parse_failures(failures.search(client, prefixes, q, FAILURES_SHOWN))


def lookup_call(client: redis.Redis, namespace: str | Sequence[str], call_id: str) -> Lookup:
    """The recorded outcome of ``call_id``.

    Kept for the outcome TTL, and a failed call's for the failures retention
    (:mod:`toolfleet.shared.failures`).

    Args:
        client: a Redis client of the fleet.
        namespace: the key prefix, or several (on a cluster each queue group's: an outcome
            is in its call's group's slot): one ``GET`` per prefix, until one has it; then
            a search of the failures index.
        call_id: the call's id.
    """
    prefixes = [namespace] if isinstance(namespace, str) else list(namespace)
    raw: Any = None
    for prefix in prefixes:
        raw = client.get(outcome_key(prefix, call_id))
        if raw is not None:
            break
    if raw is None:
        found = [f for f in search_failures(client, prefixes, call_id) if f.id == call_id]
        if not found:
            return Lookup(call_id)
        failed = found[0]
        return Lookup(call_id, failed.status, failed.function, failed.error, failed.worker)
    try:
        envelope = codec.loads(raw)
        result = envelope.get("result", envelope)
        content = result.get("content")
        error = content.get("error") if isinstance(content, dict) else None
        return Lookup(
            call_id,
            str(result.get("status")),
            str(result.get("function")),
            None if error is None else str(error),
            str(result.get("worker") or ""),
        )
    except (codec.DecodeError, AttributeError):
        return Lookup(call_id, "unreadable")


def switchable(snapshot: Snapshot) -> dict[str, tuple[str, str]]:
    """Every switch an operator may flip: name -> ``(state, source)``.

    Names are the catalogued functions, ``ext_<slug>`` of each extension and the switches
    extensions declare (the rule of ``toolfleet switch``); source is ``set`` when a state
    is stored, else ``default``.
    """
    names: dict[str, bool] = {}
    for entry in snapshot.catalog:
        names[entry.name] = True
        if entry.slug:
            names[extension_switch(entry.slug)] = True
    names.update(snapshot.declared_switches)
    found = {}
    for name, default in sorted(names.items()):
        if name in snapshot.switches:
            found[name] = (snapshot.switches[name], "set")
        else:
            found[name] = ("on" if default else "off", "default")
    return found


def _matches(failure: Failure, q: str) -> bool:
    q = q.lower()
    return any(q in (value or "").lower() for value in (failure.id, failure.function,
                                                        failure.account))  # fmt: skip


def context(
    page: str,
    snapshot: Snapshot,
    *,
    q: str = "",
    lookup: Lookup | None = None,
    matches: Sequence[Failure] | None = None,
    may_act: bool,
    csrf: str,
    role: str,
    base: str,
    error: str = "",
    message: str = "",
    login: bool = False,
    read_only: bool = False,
) -> dict[str, Any]:
    """The template context of ``page``: the snapshot and what the page derives from it.

    ``matches``: the failed calls a search for ``q`` found in the whole failures index
    (else the snapshot's newest ones are filtered by ``q``).
    """
    if matches is not None:
        listed = list(matches)[:FAILURES_SHOWN]
    else:
        listed = [f for f in snapshot.failures if not q or _matches(f, q)][:FAILURES_SHOWN]
    tools = sorted(snapshot.activity.tools.values(), key=lambda t: (-t.total, t.function))
    seen = {status for tool in tools for status, n in tool.by_status.items() if n}
    shown = [st for st in STATUS_ORDER if st == "ok" or st in seen]
    shown += sorted(seen - set(STATUS_ORDER))
    level, verdict = snapshot.verdict
    return {
        "page": page,
        "title": PAGES[page],
        "pages": PAGES,
        "s": snapshot,
        "level": level,
        "verdict": verdict,
        "tools": tools,
        "statuses": shown,
        "failures": listed,
        "q": q,
        "lookup": lookup,
        "switches": switchable(snapshot),
        "may_act": may_act,
        "csrf": csrf,
        "role": role,
        "base": base,
        "error": error,
        "message": message,
        "login": login,
        "read_only": read_only,
        "window": WINDOW_MINUTES,
    }


def sparkline(values: tuple[int, ...], width: int = 120, height: int = 24) -> Markup:
    """An inline SVG polyline of ``values`` (no script, no style attribute: CSP-clean)."""
    if not values:
        return Markup("")
    top = max(values) or 1
    step = width / max(1, len(values) - 1)
    points = " ".join(
        f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(values)
    )
    return Markup(
        f'<svg class="spark" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="calls per minute, last {len(values)} minutes, peak {top}">'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points}"/>'
        "</svg>"
    )


def _seconds(value: float | None) -> str:
    """``value`` seconds in µs below a millisecond, ms below a second, else s (one decimal)."""
    if value is None:
        return "–"
    micros = round(value * 1_000_000)
    if micros < 1000:
        return f"{micros} µs"
    millis = round(value * 1000)
    if millis < 1000:
        return f"{millis} ms"
    return f"{value:.1f} s"


def queue_summary(queues: Sequence[str]) -> list[str]:
    """A worker's queues, short: each slot queue counted after its queue instead of named.

    Slot queues serve session affinity (``<queue>.slot.<slot>``, see
    :func:`toolfleet.shared.naming.affinity_queue_for`); the queues keep their order.

    ``["tools.a", "tools.py", "tools.py.slot.h-1-0"]`` → ``["tools.a", "tools.py (+1 slot)"]``.
    """
    slots: dict[str, int] = {}
    for queue in queues:
        base, infix, _ = queue.partition(SLOT_INFIX)
        slots[base] = slots.get(base, 0) + (1 if infix else 0)
    return [
        f"{base} (+{n} slot{'' if n == 1 else 's'})" if n else base for base, n in slots.items()
    ]


def breakable(text: str) -> Markup:
    """``text``, escaped, with a line-break opportunity (``<wbr>``) after each ``_``.

    A function or status name then wraps inside a narrow column instead of widening it.
    """
    return Markup("_<wbr>").join(escape(part) for part in text.split("_"))


def _clock(value: float) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(value))


def _age(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 60:
        return f"{value:.1f} s"
    return f"{value / 60:.1f} min"


FILTERS: dict[str, Callable[..., Any]] = {
    "seconds": _seconds,
    "queue_summary": queue_summary,
    "breakable": breakable,
    "age": _age,
    "clock": _clock,
    "sparkline": sparkline,
}
