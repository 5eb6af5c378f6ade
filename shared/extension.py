"""An extension: a package of tools under one slug, with its manifest.

Its tools may be written in any supported form (:mod:`toolfleet.shared.spec`); a worker
serves each as ``ext_<slug>_<tool>`` (see :func:`toolfleet.shared.naming.function_name`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.manifest import (
    Availability,
    Manifest,
    SettingSpec,
    SwitchSpec,
    ToolOptions,
)
from toolfleet.shared.mcp_config import McpServerConfig
from toolfleet.shared.naming import default_queue_for, function_name
from toolfleet.shared.spec import ToolSpec, specs_from
from toolfleet.shared.tool import Tool

_SLUG = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,39}$")

__all__ = ["Extension"]


@dataclass
class Extension:
    """A package of tools under one slug, with its manifest.

    Args:
        slug: short name, e.g. ``date-calculator``; function names are
            ``ext_<slug>_<tool>`` with hyphens turned into underscores.
        version: the extension's version string.
        tools: tool definitions in any supported form: :class:`Tool` subclasses,
            :class:`~toolfleet.shared.plugin.MetadataPlugin` classes or instances, a
            :class:`~toolfleet.shared.toolkit.Toolkit`, or a delegate object.
        description: what the extension is for.
        timeout_s: default time limit of its tools, seconds.
        queue: the Dramatiq queue its calls go to; default ``tools.<slug>``.
        isolation: ``thread`` or ``process`` (how sync tools are run).
        settings: declared settings (``context.settings``), see
            :class:`~toolfleet.shared.manifest.SettingSpec`.
        switches: declared run-time switches.
        availability: which accounts may call it.
        enabled: a disabled extension is loaded but serves no calls.
        tool_options: per-tool overrides by tool name (timeout, idempotent, isolation, retry).
        event_payloads: include arguments and results (secrets scrubbed, truncated) in
            lifecycle signals and events; off by default (they read ``[redacted]``).
        mcp: an MCP server whose tools this extension serves (then ``tools`` is empty:
            the worker lists them from the server).
        folder: the extension's folder (where relative MCP paths start), if it has one.
        preflight: called by a worker before it serves the extension; returns why this
            host cannot serve it (e.g. a sandbox the host cannot provide), or ``None``.
            A reason keeps the extension from being served and is reported like a load
            error (``toolfleet extensions check``).
    """

    slug: str
    version: str
    tools: Sequence[Any] = ()
    description: str = ""
    timeout_s: float = 30.0
    queue: str | None = None
    isolation: str = "thread"
    settings: Sequence[SettingSpec] = ()
    switches: Sequence[SwitchSpec] = ()
    availability: Availability = field(default_factory=Availability)
    enabled: bool = True
    tool_options: Mapping[str, ToolOptions] = field(default_factory=dict)
    event_payloads: bool = False
    mcp: McpServerConfig | None = None
    folder: Path | None = None
    preflight: Callable[[], str | None] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_manifest(
        cls, manifest: Manifest, tools: Sequence[Any], folder: Path | None = None
    ) -> Extension:
        """Build an extension from a validated manifest, its tool definitions and its folder."""
        return cls(
            slug=manifest.slug,
            version=manifest.version,
            tools=tools,
            description=manifest.description,
            timeout_s=manifest.timeout,
            queue=manifest.queue,
            isolation=manifest.isolation,
            settings=manifest.settings,
            switches=manifest.switches,
            availability=manifest.availability,
            enabled=manifest.enabled,
            tool_options=manifest.tools,
            event_payloads=manifest.event_payloads,
            mcp=manifest.mcp,
            folder=folder,
        )

    @property
    def queue_name(self) -> str:
        """The queue this extension's calls go to."""
        return self.queue or default_queue_for(self.slug)

    def function_name(self, tool: type[Tool] | str) -> str:
        """The wire function name of one of this extension's tools (a class or a name).

        The plain name; a worker that also loads another extension whose tool maps to the
        same name serves both under hashed names (:func:`~toolfleet.shared.naming.function_names`).
        """
        return function_name(self.slug, tool if isinstance(tool, str) else tool.name)

    def switch_name(self, name: str) -> str:
        """The Redis name of one of this extension's switches: ``ext_<slug>_<name>``."""
        return function_name(self.slug, name)

    def specs(self) -> tuple[list[ToolSpec], list[str]]:
        """Every tool as a :class:`~toolfleet.shared.spec.ToolSpec`, and the problems found.

        Problems: invalid tools, duplicate names, a bad slug or isolation.
        """
        problems: list[str] = []
        if not _SLUG.match(self.slug):
            problems.append(f"slug {self.slug!r} must match {_SLUG.pattern}")
        if self.isolation not in ("thread", "process"):
            problems.append(f"isolation {self.isolation!r} must be thread or process")
        specs: list[ToolSpec] = []
        seen: dict[str, str] = {}
        for definition in self.tools:
            found, issues = specs_from(definition)
            problems += issues
            for spec in found:
                fname = self.function_name(spec.name)
                if fname in seen:
                    problems.append(
                        f"duplicate function name {fname} ({seen[fname]} and {spec.name})"
                    )
                    continue
                seen[fname] = spec.name
                specs.append(spec)
        if not specs and not problems:
            problems.append("no tools")
        return specs, problems

    def validate(self) -> list[ToolSpec]:
        """The specs, or :class:`ConfigurationError` listing every problem."""
        specs, problems = self.specs()
        if problems:
            raise ConfigurationError(f"extension {self.slug!r}: " + "; ".join(problems))
        return specs
