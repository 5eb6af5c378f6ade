"""The typed catalog workers publish, and the one rule that decides whether a call may run.

Workers write one :class:`CatalogEntry` per function into ``<ns>:catalog``; the
``<ns>:switches`` hash holds the switch states operators set. Producer and worker
both ask :func:`refusal` whether a call may go ahead, so a tool the producer lists
and publishes is a tool the worker runs, and the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toolfleet.shared.manifest import Availability
from toolfleet.shared.naming import DEFAULT_GROUP, extension_switch, function_name, tool_identity
from toolfleet.shared.nearest import did_you_mean
from toolfleet.shared.text import as_text
from toolfleet.shared.wire import Status

__all__ = [
    "CATALOG_REPUBLISHING",
    "CatalogEntry",
    "Refusal",
    "SwitchDeclaration",
    "governing_switches",
    "refusal",
    "entry_group",
    "switch_states",
    "switched_off",
]


class SwitchDeclaration(BaseModel):
    """A switch an extension declares, as the catalog carries it.

    Attributes:
        name: the switch's Redis name, ``ext_<slug>_<name>``.
        default: its state while ``<ns>:switches`` holds none for it.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    default: bool = True


class CatalogEntry(BaseModel):
    """What workers publish about one function (one field of ``<ns>:catalog``, JSON).

    Fields this model does not name are kept (``extra="allow"``) so that an entry
    written by a newer worker round-trips unchanged.

    Attributes:
        name: the wire function name.
        tool: the tool's own name inside its extension.
        queue: the Dramatiq queue its calls go to.
        timeout_s: its time limit, seconds.
        slug: its extension's slug.
        version: its extension's version.
        enabled: the extension's ``enabled`` and the tool's ``is_enabled()`` at the
            last refresh.
        availability: which accounts may call it.
        switches: every switch its extension declares, with its default.
        schema_hash: the hash of the description and parameters a model is shown
            (:func:`toolfleet.shared.catalog_life.schema_hash`; ``""`` from older workers).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str
    tool: str = ""
    queue: str
    timeout_s: float = 30.0
    slug: str = ""
    version: str = ""
    enabled: bool = True
    availability: Availability = Field(default_factory=Availability)
    switches: tuple[SwitchDeclaration, ...] = ()
    schema_hash: str = ""

    @property
    def identity(self) -> str | None:
        """The tool the name stands for, ``<slug>/<tool>``; ``None`` when the entry names none."""
        return tool_identity(self.slug, self.tool) if self.slug and self.tool else None

    @field_validator("availability", mode="before")
    @classmethod
    def _known_availability_fields(cls, value: Any) -> Any:
        # tolerant reader: a newer worker may add availability rules this one ignores
        if isinstance(value, Mapping):
            return {k: v for k, v in value.items() if k in Availability.model_fields}
        return value


def entry_group(entry: CatalogEntry | Mapping[str, Any]) -> str:
    """The queue group whose workers published ``entry`` (typed, or as read).

    Workers on a Redis Cluster name it in the entry (``"group"``, an extra field); on a
    plain Redis there is none and every call is of
    :data:`~toolfleet.shared.naming.DEFAULT_GROUP`.
    """
    extra = entry if isinstance(entry, Mapping) else (entry.model_extra or {})
    group = extra.get("group")
    return group if isinstance(group, str) and group else DEFAULT_GROUP


#: What the model reads for a function missing from a catalog being republished.
CATALOG_REPUBLISHING = (
    "the tool catalog is being republished after Redis lost its data; retry shortly"
)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a call is answered without running.

    Attributes:
        status: ``unknown_function``, ``not_available`` or (producer only) ``rejected``.
        message: what the model reads.
    """

    status: Status
    message: str


def switch_states(raw: Mapping[Any, Any]) -> dict[str, bool]:
    """The ``<ns>:switches`` hash as read (bytes or str) -> switch name -> on."""
    return {as_text(k): v in (b"on", "on", b"1", "1") for k, v in raw.items()}


def governing_switches(entry: CatalogEntry) -> dict[str, bool]:
    """The switches that turn ``entry``'s function off -> each one's default state.

    They are the function's own name, its extension's ``ext_<slug>``, and a switch the
    extension declares under the tool's name (``ext_<slug>_<tool>``); a switch takes
    its declared default while the switch hash holds no state for it, and is on when
    nothing declares it.
    """
    declared = {s.name: s.default for s in entry.switches}
    names = [entry.name, extension_switch(entry.slug)]
    if entry.tool:
        tool_switch = function_name(entry.slug, entry.tool)
        if tool_switch in declared:
            names.append(tool_switch)
    return {name: declared.get(name, True) for name in names}


def switched_off(
    entry: CatalogEntry,
    switches: Mapping[str, bool],
    governing: Mapping[str, bool] | None = None,
) -> bool:
    """True when a switch governing ``entry`` is off (unset ones at their declared default).

    Args:
        entry: the function's catalog entry.
        switches: switch name -> on, as the switch hash holds them (unset ones absent).
        governing: ``governing_switches(entry)`` when the caller has it already.
    """
    if governing is None:
        governing = governing_switches(entry)
    return not all(switches.get(n, d) for n, d in governing.items())


def refusal(
    function: str,
    entry: CatalogEntry | None,
    switches: Mapping[str, bool],
    account: str | None,
    *,
    live: bool = True,
    republishing: bool = False,
    known: Mapping[str, CatalogEntry] | None = None,
    governing: Mapping[str, bool] | None = None,
) -> Refusal | None:
    """Why ``function`` may not be offered or called for ``account`` now (``None``: it may).

    Checks, in order: the function exists (``unknown_function``), a live worker
    serves it, it is enabled, every switch that governs it is on (a switch unset in
    ``switches`` takes its declared default, see :func:`governing_switches`), and its
    extension is available to the account (all ``not_available``).

    Args:
        function: the wire function name asked for.
        entry: its catalog entry, or ``None`` when the catalog has none.
        switches: switch name -> on, as the switch hash holds them (unset ones absent).
        account: the calling account, or ``None``.
        live: whether a worker with a fresh heartbeat serves its queue.
        republishing: whether a function without an entry may be one the catalog has
            not been given back yet after Redis lost its data (see
            :mod:`toolfleet.shared.catalog_epoch`): ``not_available`` then, which a
            caller retries, instead of ``unknown_function``.
        known: the catalog (function name -> entry); an ``unknown_function`` message
            then names the nearest functions available to ``account``
            (:func:`toolfleet.shared.nearest.did_you_mean`), e.g. ``unknown function
            'ext_bfcl_math_gdc'; did you mean 'ext_bfcl_math_gcd'?``.
        governing: ``governing_switches(entry)`` when the caller has it already (a
            worker keeps it per entry).
    """
    if entry is None and republishing:
        return Refusal(Status.NOT_AVAILABLE, CATALOG_REPUBLISHING)
    if entry is None:
        offered = (
            (name for name, e in known.items() if e.availability.allows(account)) if known else ()
        )
        hint = did_you_mean(function, offered)
        return Refusal(Status.UNKNOWN_FUNCTION, f"unknown function {function!r}{hint}")
    if not live:
        message = f"no live worker serves {function!r} (queue {entry.queue})"
        return Refusal(Status.NOT_AVAILABLE, message)
    if not entry.enabled:
        return Refusal(Status.NOT_AVAILABLE, f"{function} is disabled")
    if switched_off(entry, switches, governing):
        return Refusal(Status.NOT_AVAILABLE, f"{function} is switched off")
    if not entry.availability.allows(account):
        return Refusal(Status.NOT_AVAILABLE, f"{function} is not available to this account")
    return None
