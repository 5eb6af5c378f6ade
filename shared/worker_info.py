"""What a worker process says about itself with each heartbeat (read by the ops page).

Each worker process writes one :class:`WorkerInfo` to the hash ``<ns>:worker_info``
(:func:`~toolfleet.shared.naming.worker_info_key`), field = its worker id, in the
pipeline of its heartbeat: no extra round trip. Entries of processes that stopped
beating are removed by the live ones (:func:`stale_ids`), so the hash holds about one
field per live worker process.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["STALE_AFTER_TTLS", "WorkerInfo", "parse_worker_infos", "stale_ids"]

#: An entry older than this many worker TTLs belongs to a process that is gone.
STALE_AFTER_TTLS = 3.0


class WorkerInfo(BaseModel):
    """One worker process at its last heartbeat.

    Attributes:
        worker_id: ``host:pid``.
        supervisor: ``host:pid`` of the supervisor that started it ("" when unknown).
        at: when it beat, Unix epoch seconds.
        queues: the queues it consumes, sorted.
        threads: its worker threads (0 when unknown).
        version: the toolfleet version it runs.
        rtt_ms: milliseconds its previous heartbeat's Redis round trip took (None
            before the second beat).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    worker_id: str
    supervisor: str = ""
    at: float
    queues: tuple[str, ...] = ()
    threads: int = Field(default=0, ge=0)
    version: str = ""
    rtt_ms: float | None = None


def parse_worker_infos(raw: Mapping[bytes | str, bytes | str]) -> list[WorkerInfo]:
    """Decode the hash's fields, skipping any that do not parse; sorted by worker id."""
    found = []
    for value in raw.values():
        try:
            found.append(WorkerInfo.model_validate_json(value))
        except ValidationError:
            continue
    return sorted(found, key=lambda info: info.worker_id)


def stale_ids(infos: list[WorkerInfo], now: float, worker_ttl_s: float) -> list[str]:
    """Worker ids whose last beat is older than :data:`STALE_AFTER_TTLS` worker TTLs."""
    cutoff = now - STALE_AFTER_TTLS * worker_ttl_s
    return [info.worker_id for info in infos if info.at < cutoff]
