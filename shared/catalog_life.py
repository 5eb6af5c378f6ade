"""Catalog entries with a life: who serves a name, until when, and which tool it names.

A name is in the catalog while a live worker serves it. Each heartbeat a worker runs
:data:`PUBLISH_SCRIPT` once for all the functions it serves:

- ``<ns>:catalog:live`` (sorted set: name -> the newest heartbeat of a worker serving it,
  epoch seconds) is raised to now for each of its names, and ``<ns>:catalog:workers:<name>``
  (sorted set: worker id -> heartbeat) records the workers that serve the name; it
  expires by itself three TTLs after its last worker's beat.
- A name whose newest heartbeat is older than one worker TTL leaves: its catalog entry,
  its owner and its liveness are deleted (by whichever worker beats next). Until then,
  and when no worker is left to delete it, readers leave it out themselves
  (:func:`listed`), so a name no worker serves any more (its workers stopped, or every
  worker still running serves a version of the extension without it) is gone from every
  listing within one TTL of its last worker's last heartbeat. A rolling upgrade, where
  workers of both versions beat, keeps the names of both.

**One name, one tool, fleet-wide (first keeps it).** ``<ns>:catalog:owners`` (hash:
name -> :func:`tool_identity`, ``<slug>/<tool>``) says which tool a name stands for.
A worker whose tool maps to a name another tool owns while that tool's workers are live
is refused the name: its entry is not written, the script returns the name and its
owner, and the worker reports the collision (extension errors, a metric, the events
stream) and answers calls to that name ``not_available``. The first tool keeps the name
because models already hold tool lists naming it; a newcomer cannot take it away or
rename it. Once the owner's workers have been gone for one TTL, the name is free.
Within one worker process, two tools whose plain names clash both get hashed names
(:func:`toolfleet.shared.naming.function_names`).

**Rolling upgrades.** While workers of two versions consume one queue, a call to a name
only one version serves may be fetched by a worker of the other: that worker hands the
message back to the queue (a few times at most) instead of answering
``unknown_function``, since the name is listed (:mod:`toolfleet.worker.messaging.actors`).

**Pinning.** A producer puts the listed entry's ``identity`` (and, when its caller asks,
the ``schema_hash`` the model was shown) on the request, and the worker refuses a call
whose tool is not that one (:func:`pin_refusal`), before running it. Each beat also
records which schema of each name the worker serves, in ``<ns>:catalog:schemas:<name>``
(sorted set: ``<schema hash> <worker id>`` -> heartbeat; a stopping worker removes its
members), and gives back the schemas the live workers serve (:func:`live_schemas`). So in
a rolling upgrade that changed a tool's schema, a call pinned to the schema of the other
version, which a live worker still serves, is handed back to the queue like a call to a
name this worker does not serve, and a worker of its version answers it; it is refused
only once no live worker serves that schema.

Entries written by workers that keep no liveness (none in ``<ns>:catalog:live``) are
listed as before: by the liveness of their queue only.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from toolfleet.shared import scripts
from toolfleet.shared.catalog import Refusal
from toolfleet.shared.naming import tool_identity
from toolfleet.shared.status import Status
from toolfleet.shared.text import as_text

__all__ = [
    "CHANGED_SINCE_LISTED",
    "PUBLISH_SCRIPT",
    "beats_of",
    "contested_message",
    "listed",
    "live_schemas",
    "pin_refusal",
    "schema_hash",
    "tool_identity",
]

#: What the model reads when the tool behind a name changed since it was listed.
CHANGED_SINCE_LISTED = "the tool changed since it was listed: list tools again ({why})"

#: KEYS: catalog hash, liveness sorted set, owners hash, then the workers set of each
#: published name, then its schemas set, both in ARGV order. ARGV: now (epoch s), the
#: cutoff (epoch s: a newest heartbeat before it has left), this worker's id, the sets'
#: lifetime (ms), then per name: name, identity, entry (JSON), schema hash. Returns
#: ``{contested, gone, listed, schemas}``: name/owner pairs this worker was refused, flat;
#: the names that left; the names listed now; per name written, ``{name, member...}``
#: of the schemas set members that beat since the cutoff (:func:`live_schemas`).
PUBLISH_SCRIPT = scripts.source("catalog_publish")


def schema_hash(description: str | None, parameters: Any) -> str:
    """The hash of what a model is shown of a tool: 16 hex digits of SHA-256.

    Over the description and the parameters' JSON Schema, keys sorted, so the same
    schema hashes the same in every process.

    Args:
        description: the tool's description.
        parameters: its arguments' JSON Schema (an object), or ``None``.
    """
    shown = {"description": description or "", "parameters": parameters or {}}
    text = json.dumps(shown, sort_keys=True, separators=(",", ":"))  # ASCII: escapes all
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:16]


def beats_of(reply: Sequence[Any]) -> dict[str, float]:
    """``ZRANGE <ns>:catalog:live 0 -1 WITHSCORES`` as redis-py returns it -> name -> beat."""
    return {as_text(name): float(score) for name, score in reply}


def live_schemas(reply: Sequence[Any]) -> dict[str, frozenset[str]]:
    """The publish script's ``schemas`` reply -> name -> the schema hashes live workers serve.

    Args:
        reply: ``[[name, "<hash> <worker id>", ...], ...]`` as redis-py returns it.
    """
    found: dict[str, frozenset[str]] = {}
    for item in reply:
        name, *members = (as_text(value) for value in item)
        found[name] = frozenset(member.split(" ", 1)[0] for member in members)
    return found


_E = TypeVar("_E")


def listed(entries: Mapping[str, _E], beats: Mapping[str, float], cutoff: float) -> dict[str, _E]:
    """The entries a reader lists: those served within one TTL, and those with no liveness.

    Args:
        entries: name -> entry, as the catalog hash holds them.
        beats: name -> newest heartbeat of a worker serving it (:func:`beats_of`).
        cutoff: epoch seconds, now minus the worker TTL: a name whose newest heartbeat is
            older has left (its workers are gone, or serve a version without it).
    """
    return {name: e for name, e in entries.items() if beats.get(name, cutoff) >= cutoff}


def contested_message(name: str, owner: str, mine: str) -> str:
    """The extension problem a worker refused ``name`` reports."""
    return (
        f"{name} stands for {owner} in this fleet (its workers were first); {mine} maps to "
        "the same name and is not served under it: rename one of the two tools"
    )


def pin_refusal(
    function: str,
    identity: str,
    served_hash: str,
    *,
    asked_identity: str | None,
    asked_hash: str | None,
) -> Refusal | None:
    """Why a call pinned to a tool (or a schema) may not run on this one (``None``: it may).

    Args:
        function: the name called.
        identity: the served tool's :func:`tool_identity`.
        served_hash: the served tool's :func:`schema_hash`.
        asked_identity: the identity the producer listed the name with, if any.
        asked_hash: the schema hash the caller's model was shown, if any.

    Returns:
        ``not_available`` with :data:`CHANGED_SINCE_LISTED`, which tells the model to list
        tools again.
    """
    if asked_identity is not None and asked_identity != identity:
        why = f"{function} was {asked_identity}, this worker serves {identity}"
        return Refusal(Status.NOT_AVAILABLE, CHANGED_SINCE_LISTED.format(why=why))
    if asked_hash is not None and asked_hash != served_hash:
        why = f"schema {asked_hash} was listed, {function} now has schema {served_hash}"
        return Refusal(Status.NOT_AVAILABLE, CHANGED_SINCE_LISTED.format(why=why))
    return None
