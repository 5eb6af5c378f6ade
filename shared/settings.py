"""Settings: the one door through which toolfleet reads the environment (``TOOLFLEET_*``)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from toolfleet.shared.urls import url_passwords

__all__ = ["Settings"]


class Settings(BaseSettings):
    """toolfleet settings; each field reads ``TOOLFLEET_<NAME>`` (e.g. ``TOOLFLEET_REDIS_URL``).

    Attributes:
        redis_url: ``redis://`` or ``unix://`` URL; ``None`` means "not configured"
            (only ``toolfleet demo`` then starts an embedded Redis).
        redis_client: ``MODULE:ATTR`` of a factory returning a ready ``redis.Redis``
            (Sentinel, credential providers, custom TLS); when set, ``toolfleet worker``
            and each of its processes call it instead of connecting to ``redis_url``.
        namespace: prefix of every Redis key.
        queue_group: the queue group a worker serves (``deploy/k8s/queue-groups.toml``):
            on a Redis Cluster its keys share one slot (docs/cluster.md); on a plain
            Redis it changes no key.
        reply_ttl_s: seconds a reply list lives after its last push.
        heartbeat_interval_s: seconds between worker heartbeats and catalog refreshes.
        worker_ttl_s: a worker whose last heartbeat is older than this is not live.
        catalog_cache_s: seconds a producer trusts its cached catalog.
        shutdown_grace_s: seconds a worker process waits for running calls on SIGTERM.
        default_timeout_s: time limit of a tool that states none.
        redis_timeout_s: seconds a producer waits on one Redis command or connection
            attempt (bounds how late a call can return when Redis stalls).
        max_arguments_bytes: largest encoded ``arguments`` a producer publishes and a worker
            accepts, bytes; larger ones are answered ``rejected``.
        max_queue_length: most messages a queue may hold (queued, prefetched or running)
            before a producer refuses new calls to it with ``rejected``; read from Redis
            (``HLEN`` of Dramatiq's ``<queue>.msgs`` hash) with each catalog refresh.
        max_result_bytes: largest encoded result a worker posts, bytes; a larger one
            becomes a ``tool_error`` telling the model to ask for less.
        max_stuck_threads: a worker process whose abandoned (timed-out) tool threads
            still running exceed this is drained and replaced.
        broker_heartbeat_timeout_s: seconds without a heartbeat after which Dramatiq
            hands a worker's unacknowledged messages to others (its default is 60).
        log_format: worker log records as ``text`` or ``json`` lines.
        metrics_port: port of the supervisor's Prometheus ``/metrics``; 0 turns it off.
        health_dir: folder of the worker processes' heartbeat files (``toolfleet health``).
        health_stale_s: a heartbeat file older than this fails ``toolfleet health --live``.
        extension_paths: folders to load extensions from (``os.pathsep``-separated); each
            folder holding a manifest is one extension, else each sub-folder that does.
        secrets_dir: folder of mounted secret files for extension settings (one file
            per setting, named like its environment variable).
        quota_in_flight: calls an account may have in flight at once when it has no quota
            of its own (``toolfleet limits set``); ``None``: no limit.
        quota_per_s: calls per second an account may make when it has no quota of its
            own; ``None``: no limit.
        quota_burst: calls at once above ``quota_per_s`` (``None``: the rate rounded up).
        quality_models: the model names (``context.llmclient``) counted by name in the
            aggregates and metrics (``TOOLFLEET_QUALITY_MODELS`` as a JSON list, e.g.
            ``'["openai/gpt-4o", "anthropic/claude-sonnet-4"]'``); every other model
            counts as ``other`` (:func:`toolfleet.shared.metric_labels.model_label`).
        aggregates_ttl_s: seconds each minute of the call aggregates lives in Redis
            (:mod:`toolfleet.shared.aggregates`); 0 turns them off (nothing is counted).
        failures_retention_s: seconds a failed call (any status but ``ok``) stays
            findable by id on the ops page's failures page and with ``toolfleet events
            --call`` (:mod:`toolfleet.shared.failures`); 0 keeps no failures index.
        failures_max: most failed calls the failures index keeps per key prefix (the
            oldest go first): with ``failures_retention_s``, the bound of its memory
            (about 400 bytes a call).
        claim_replicas: replicas a worker's claim of a non-idempotent tool's call must
            reach (``WAIT``) before the tool runs, so that a master's failover does not
            lose the claim and run the call twice; ``None`` (the default): 1 when the
            claim's master has a replica, else 0; 0 turns the wait off (docs/cluster.md).
        claim_replicas_timeout_ms: longest that wait, milliseconds; past it the call runs
            anyway, counted in ``toolfleet_claims_unreplicated_total`` and logged.
        crash_reruns: times a call whose run ended its worker process (killed, out of
            memory, a segfault) is run again, at most, before it is answered ``crashed``
            and dead-lettered: also for an idempotent tool (a non-idempotent one is never
            re-run). Counted per call id in Redis until the call's deadline.
        affinity_ttl_s: seconds a conversation's route to the worker process holding its
            session (session affinity) is kept after its last call
            (:mod:`toolfleet.shared.affinity`); longer than a session lives idle.
    """

    model_config = SettingsConfigDict(env_prefix="TOOLFLEET_", extra="ignore")

    redis_url: str | None = None
    redis_client: str | None = None
    namespace: str = "toolfleet"
    queue_group: str = Field(default="default", min_length=1)
    reply_ttl_s: int = Field(default=300, ge=1)
    heartbeat_interval_s: float = Field(default=2.0, gt=0)
    worker_ttl_s: float = Field(default=10.0, gt=0)
    catalog_cache_s: float = Field(default=1.0, ge=0)
    shutdown_grace_s: float = Field(default=30.0, ge=0)
    default_timeout_s: float = Field(default=30.0, gt=0)
    redis_timeout_s: float = Field(default=2.0, gt=0)
    max_arguments_bytes: int = Field(default=1_048_576, ge=1024)
    max_queue_length: int = Field(default=100_000, ge=1)
    max_result_bytes: int = Field(default=1_048_576, ge=1024)
    max_stuck_threads: int = Field(default=16, ge=1)
    broker_heartbeat_timeout_s: float = Field(default=15.0, gt=1)
    log_format: Literal["text", "json"] = "text"
    metrics_port: int = Field(default=9191, ge=0, le=65535)
    health_dir: Path = Field(
        default_factory=lambda: Path(tempfile.gettempdir()) / "toolfleet-health"
    )
    health_stale_s: float = Field(default=30.0, gt=0)
    extension_paths: str = ""
    secrets_dir: Path | None = None
    quota_in_flight: int | None = Field(default=None, ge=1)
    quota_per_s: float | None = Field(default=None, gt=0)
    quota_burst: int | None = Field(default=None, ge=1)
    quality_models: list[Annotated[str, Field(min_length=1, max_length=256)]] = Field(
        default_factory=list, max_length=64
    )
    aggregates_ttl_s: int = Field(default=86_400, ge=0)
    failures_retention_s: int = Field(default=86_400, ge=0)
    failures_max: int = Field(default=200_000, ge=1)
    affinity_ttl_s: int = Field(default=3600, ge=1)
    claim_replicas: int | None = Field(default=None, ge=0)
    claim_replicas_timeout_ms: int = Field(default=100, ge=1, le=60_000)
    crash_reruns: int = Field(default=2, ge=0, le=100)

    def extension_folders(self) -> list[Path]:
        """``extension_paths`` split on ``os.pathsep`` (``:`` on Linux), empty parts dropped."""
        return [Path(p) for p in self.extension_paths.split(os.pathsep) if p.strip()]

    def as_environment(self) -> dict[str, str]:
        """These settings as ``TOOLFLEET_*`` variables, which :meth:`from_env` reads back.

        How a worker process gets its settings from the supervisor: through its
        inherited environment, never its command line (``/proc/<pid>/cmdline`` is
        readable by every user of the machine; ``environ`` only by the same user).

        Returns:
            ``{"TOOLFLEET_<NAME>": text}`` for each field that is not ``None``.
        """
        values = self.model_dump(mode="json", exclude_none=True)
        return {
            f"TOOLFLEET_{name.upper()}": json.dumps(value)
            if isinstance(value, list)
            else str(value)
            for name, value in values.items()
        }

    def secret_values(self) -> set[str]:
        """Values of these settings that are secrets, to scrub by value from replies and logs.

        The password of ``redis_url`` (in its user part or a ``password=`` parameter); a
        tool that returns its process's environment shows ``TOOLFLEET_REDIS_URL``. A
        password a ``redis_client`` factory uses is not known here.
        """
        return url_passwords(self.redis_url)

    @classmethod
    def variable_names(cls) -> set[str]:
        """Every ``TOOLFLEET_<NAME>`` this class reads."""
        return {f"TOOLFLEET_{name.upper()}" for name in cls.model_fields}

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Read ``TOOLFLEET_*``; keyword arguments that are not ``None`` win over the env."""
        return cls(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
