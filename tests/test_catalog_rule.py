"""The one rule producer and worker use to decide whether a function may be called."""

from __future__ import annotations

from typing import Any

from toolfleet.shared import Status
from toolfleet.shared.catalog import CatalogEntry, refusal


def _entry(**fields: Any) -> CatalogEntry:
    base: dict[str, Any] = {"name": "ext_dates_add", "tool": "add", "queue": "tools.dates",
                            "slug": "dates"}  # fmt: skip
    return CatalogEntry.model_validate({**base, **fields})


def _status(entry: CatalogEntry | None, switches: dict[str, bool], **kw: Any) -> Status | None:
    found = refusal("ext_dates_add", entry, switches, kw.pop("account", None), **kw)
    return None if found is None else found.status


def test_each_reason_in_order() -> None:
    """Unknown, not live, disabled, switched off, not for the account; otherwise callable."""
    assert _status(None, {}) is Status.UNKNOWN_FUNCTION
    assert _status(None, {}, republishing=True) is Status.NOT_AVAILABLE
    assert _status(_entry(), {}, live=False) is Status.NOT_AVAILABLE
    assert _status(_entry(enabled=False), {}) is Status.NOT_AVAILABLE
    assert _status(_entry(), {"ext_dates": False}) is Status.NOT_AVAILABLE
    assert _status(_entry(), {"ext_dates_add": False}) is Status.NOT_AVAILABLE
    limited = _entry(availability={"accounts_allowed": ["acme"], "from_a_newer_worker": 1})
    assert _status(limited, {}, account="globex") is Status.NOT_AVAILABLE
    assert _status(limited, {}, account="acme") is None
    assert _status(_entry(), {}) is None


def test_a_declared_switch_takes_its_default_until_set() -> None:
    """A switch declared under the tool's name and off by default turns it off while unset,
    also when the function's name is hashed; other declared switches do not govern it."""
    declared = [{"name": "ext_dates_add", "default": False}, {"name": "ext_dates_loud"}]
    off = _entry(switches=declared)
    assert _status(off, {}) is Status.NOT_AVAILABLE
    assert _status(off, {"ext_dates_add": True}) is None
    hashed = _entry(name="ext_dates_add_1a2b3c", switches=declared)
    found = refusal("ext_dates_add_1a2b3c", hashed, {}, None)
    assert found is not None and found.message.endswith("switched off")
    assert _status(_entry(switches=[{"name": "ext_dates_loud", "default": False}]), {}) is None
