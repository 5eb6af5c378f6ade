"""A function as one worker process serves it: the tool spec bound to its extension."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from pydantic import BaseModel

from toolfleet.shared.catalog import CatalogEntry
from toolfleet.shared.catalog_life import schema_hash, tool_identity
from toolfleet.shared.extension import Extension
from toolfleet.shared.manifest import RetryPolicy
from toolfleet.shared.spec import ToolSpec
from toolfleet.shared.tenancy.breakers import BreakerPolicy

__all__ = ["ServedTool"]


@dataclass(frozen=True)
class ServedTool:
    """One callable function of this worker.

    Attributes:
        function: wire name, ``ext_<slug>_<tool>``.
        spec: the tool, whatever form it was written in.
        extension: the extension it belongs to.
        queue: the Dramatiq queue that carries its calls.
        timeout_s: its time limit in seconds.
        settings: the extension's loaded settings model, or ``None``.
        idempotent: whether it may be re-run after its worker died, or retried.
        isolation: ``thread`` or ``process`` (how a call runs).
        retry: its retry policy, if any.
        concurrency: most calls running at once fleet-wide, if limited.
        breaker: its circuit breaker policy, if any.
        result_shaping: ``error`` or ``truncate``: what a result over its budget becomes.
    """

    function: str
    spec: ToolSpec
    extension: Extension
    queue: str
    timeout_s: float
    settings: BaseModel | None = None
    idempotent: bool = False
    isolation: str = "thread"
    retry: RetryPolicy | None = None
    concurrency: int | None = None
    breaker: BreakerPolicy | None = None
    result_shaping: str = "error"

    @property
    def arguments_model(self) -> type[BaseModel]:
        """The pydantic model arguments are validated with."""
        return self.spec.arguments_model

    @cached_property
    def identity(self) -> str:
        """The tool this function stands for fleet-wide, ``<slug>/<tool>``."""
        return tool_identity(self.extension.slug, self.spec.name)

    @cached_property
    def schema_hash(self) -> str:
        """The hash of the description and parameters a model is shown of it."""
        return schema_hash(self.spec.description, self.spec.parameters)

    @property
    def is_async(self) -> bool:
        """True when the tool is a coroutine function."""
        return self.spec.is_async

    def catalog_entry(
        self, *, enabled: bool = True, preparation: str | None = None
    ) -> CatalogEntry:
        """What workers publish about this function (no setting values).

        Args:
            enabled: the tool's own ``is_enabled()`` at this refresh (the extension's
                ``enabled`` is applied too).
            preparation: the tool's preparation text at this refresh, if any.
        """
        ext = self.extension
        return CatalogEntry.model_validate(
            {
                "name": self.function,
                "tool": self.spec.name,
                "description": self.spec.description,
                "parameters": self.spec.parameters,
                "display_name": self.spec.display_name,
                "display_description": self.spec.display_description,
                "display_parameters": self.spec.display_parameters,
                "preparation": preparation,
                "affinity": self.spec.affinity,
                "queue": self.queue,
                "timeout_s": self.timeout_s,
                "idempotent": self.idempotent,
                "isolation": self.isolation,
                "slug": ext.slug,
                "version": ext.version,
                "schema_hash": self.schema_hash,
                "enabled": ext.enabled and enabled,
                "availability": ext.availability.model_dump(),
                "switches": [
                    {"name": ext.switch_name(s.name), "default": s.default} for s in ext.switches
                ],
                "settings": [s.name for s in ext.settings],
                "annotations": self.spec.annotations,
                "output_schema": self.spec.output_schema,
                # declared fleet-wide limits (their live state is in Redis: toolfleet top)
                "concurrency": self.concurrency,
                "breaker": None if self.breaker is None else self.breaker.model_dump(),
            }
        )
