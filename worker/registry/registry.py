"""The registry: the functions one worker process serves, and how to call one of them.

Both the worker process and each ``process``-isolation child build one: it loads
extensions (settings, switch defaults, secrets for redaction, MCP servers), names their
functions, probes whether each is enabled, and builds a call's
:class:`~toolfleet.shared.tool.ExtensionContext`. It answers no call itself: that is
the pipeline's job (:mod:`toolfleet.worker.pipeline.calls`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from toolfleet.shared.catalog import CatalogEntry
from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.extension import Extension
from toolfleet.shared.naming import function_names
from toolfleet.shared.spec import ToolSpec
from toolfleet.shared.tool import ExtensionContext
from toolfleet.shared.wire import ToolCallRequest
from toolfleet.worker.registry.extension_settings import load_settings, secret_values
from toolfleet.worker.registry.redaction import Redactor
from toolfleet.worker.registry.served_tool import ServedTool
from toolfleet.worker.registry.switches import SwitchBoard

if TYPE_CHECKING:
    from toolfleet.worker.mcp.servers import McpServers

__all__ = ["PLAIN_CONTEXT_FIELDS", "Registry"]

log = logging.getLogger("toolfleet.worker")

_UNSERVABLE = "extension %s is not served on this host: %s"
_CLASH = "%s clashes with another extension's tool: served as %s"

#: ExtensionContext fields that are plain values (they travel to a child process as such).
PLAIN_CONTEXT_FIELDS = (
    "call_id", "function", "slug", "version", "deadline", "tool_call_id", "account", "user",
    "llmclient", "conversation", "traceparent", "metadata", "session_lost", "max_result_bytes",
)  # fmt: skip


class Registry:
    """The functions served by this process.

    Args:
        namespace: key prefix (for switches).
        secrets_dir: folder of mounted secret files for extension settings.
        redactor: collects the secret setting values of every loaded extension (the
            process's log filter uses the same one); a new one when omitted.
        start_mcp: start the MCP servers of MCP extensions (off in ``process``-isolation
            children, which never run MCP tools: those skip MCP extensions).
        unservable_log_level: the logging level of "extension X is not served on this
            host" (:meth:`add_extensions`); a supervisor's worker processes but the first,
            and ``process``-isolation children, say it at ``DEBUG``, so that a host says it
            once.

    Attributes:
        served: function name -> :class:`ServedTool` (swapped whole when an MCP server's
            tool list changes).
        extensions: slug -> loaded extension.
        errors: extension source -> why it was not loaded.
        switches: switch states, with the declared defaults of every loaded extension.
        tool_states: function -> (enabled, preparation text) at the last refresh.
        mcp: the MCP sessions of this process (``None`` until an MCP extension loads).
        withdrawn: functions an MCP server stopped offering, to remove from the catalog.
        contested: function -> the tool (``<slug>/<tool>``) that holds the name fleet-wide
            while this process's tool of that name is refused it
            (:mod:`toolfleet.shared.catalog_life`); set at each catalog heartbeat.
        listed: the names the fleet's catalog lists (a live worker serves them), as of
            this process's last catalog heartbeat.
        live_schemas: function -> the schema hashes the fleet's live workers serve of it
            (this process's included), as of its last catalog heartbeat.
    """

    def __init__(
        self,
        namespace: str = "toolfleet",
        *,
        secrets_dir: Path | None = None,
        redactor: Redactor | None = None,
        start_mcp: bool = True,
        unservable_log_level: int = logging.WARNING,
    ) -> None:
        self.served: dict[str, ServedTool] = {}
        self.extensions: dict[str, Extension] = {}
        self.errors: dict[str, str] = {}
        self.secrets_dir = secrets_dir
        self.switches = SwitchBoard(namespace)
        self.redactor = redactor if redactor is not None else Redactor()
        self.tool_states: dict[str, tuple[bool, str | None]] = {}
        self._entries: dict[str, tuple[ServedTool, CatalogEntry]] = {}
        self.start_mcp = start_mcp
        self.unservable_log_level = unservable_log_level
        self.mcp: McpServers | None = None
        self.withdrawn: set[str] = set()
        self.contested: dict[str, str] = {}
        self.listed: frozenset[str] = frozenset()
        self.live_schemas: dict[str, frozenset[str]] = {}
        self._withdrawn_lock = threading.Lock()
        self._settings: dict[str, BaseModel | None] = {}

    # -- loading ---------------------------------------------------------------

    def add_extension(self, extension: Extension) -> None:
        """Serve every tool of ``extension``.

        Raises:
            ConfigurationError: the extension is invalid, its settings do not load, its
                preflight says this host cannot serve it, or a name is taken; nothing of
                it is added then. An MCP extension whose server cannot be started is such
                an extension.
        """
        if extension.mcp is None:
            extension.validate()
        unservable = extension.preflight() if extension.preflight is not None else None
        if unservable:
            raise ConfigurationError(f"extension {extension.slug!r}: {unservable}")
        self._add(extension)

    def _add(self, extension: Extension) -> None:
        """:meth:`add_extension` once the extension's preflight said this host can serve it."""
        if extension.slug in self.extensions:
            raise ConfigurationError(f"extension {extension.slug!r} is loaded already")
        settings = load_settings(extension, self.secrets_dir)
        # known before anything can fail: an MCP server's start error may quote a secret
        self.redactor.add(secret_values(settings))
        if extension.mcp is not None:
            if not self.start_mcp:
                return
            extension = self._start_mcp(extension, settings)
        try:
            specs = extension.validate()
            served = self._named([self._serve(extension, spec, settings) for spec in specs])
        except ConfigurationError:
            if self.mcp is not None:
                self.mcp.stop(extension.slug)
            raise
        self.extensions[extension.slug] = extension
        self._settings[extension.slug] = settings
        for switch in extension.switches:
            self.switches.defaults[extension.switch_name(switch.name)] = switch.default
        for item in served:
            self.served[item.function] = item

    def _named(
        self, new: list[ServedTool], served: dict[str, ServedTool] | None = None
    ) -> list[ServedTool]:
        """Give ``new`` and the functions served already distinct names.

        Tools of two extensions whose plain names clash (``a-b``/``c`` and ``a``/``b_c``
        are both ``ext_a_b_c``) all get hashed names (:func:`function_names`), so both
        extensions serve; a served function renamed this way is re-keyed in ``served``
        (default :attr:`served`).
        """
        served = self.served if served is None else served
        pairs = [(s.extension.slug, s.spec.name) for s in [*served.values(), *new]]
        names = function_names(pairs)
        for function, item in list(served.items()):
            name = names[(item.extension.slug, item.spec.name)]
            if name != function:
                del served[function]
                served[name] = dataclasses.replace(item, function=name)
                log.warning(_CLASH, function, name)
        named = []
        for item in new:
            name = names[(item.extension.slug, item.spec.name)]
            if name != item.function:
                log.warning(_CLASH, item.function, name)
                item = dataclasses.replace(item, function=name)
            named.append(item)
        return named

    def _mcp_servers(self) -> McpServers:
        if self.mcp is None:
            try:
                from toolfleet.worker.mcp.servers import McpServers
            except ImportError as exc:
                raise ConfigurationError(
                    f"an extension declares an MCP server, but the MCP SDK is not installed "
                    f"({exc}): pip install 'toolfleet[mcp]'"
                ) from None
            self.mcp = McpServers(self._replace_tools)
        return self.mcp

    def _start_mcp(self, extension: Extension, settings: BaseModel | None) -> Extension:
        """Start the extension's MCP server; the extension with the server's tools."""
        specs, problems = self._mcp_servers().start(extension, settings)
        self._note_tool_problems(extension.slug, problems)
        return dataclasses.replace(extension, tools=specs)

    def _begin_mcp(self, extensions: list[Extension]) -> None:
        """Start every MCP server at once, so that their start times do not add up."""
        for extension in extensions:
            if extension.mcp is None or not self.start_mcp or extension.slug in self.extensions:
                continue
            try:
                settings = load_settings(extension, self.secrets_dir)
                self.redactor.add(secret_values(settings))
                self._mcp_servers().begin(extension, settings)
            except ConfigurationError:
                continue  # add_extension reports it

    def _note_tool_problems(self, slug: str, problems: list[str]) -> None:
        source = f"MCP tools of {slug}"
        if problems:
            self.errors[source] = self.redactor.scrub("; ".join(problems))
            log.error("extension %s: %s", slug, self.errors[source])
        else:
            self.errors.pop(source, None)

    def _replace_tools(self, slug: str, specs: list[ToolSpec], problems: list[str]) -> None:
        """Serve ``specs`` as the whole tool list of MCP extension ``slug`` from now on."""
        extension = dataclasses.replace(self.extensions[slug], tools=specs)
        settings = self._settings[slug]
        others = {f: s for f, s in self.served.items() if s.extension.slug != slug}
        try:
            validated = extension.validate()
            named = self._named(
                [self._serve(extension, spec, settings) for spec in validated], others
            )
        except ConfigurationError as exc:
            log.error("extension %s: new MCP tool list not applied: %s", slug, exc)
            return
        self._note_tool_problems(slug, problems)
        fresh = {item.function: item for item in named}
        gone = set(self.served) - set(others) - set(fresh)
        self.extensions[slug] = extension
        self.served = {**others, **fresh}  # one swap: callers see the old or the new map
        with self._withdrawn_lock:
            self.withdrawn |= gone
        log.info("extension %s: MCP tools now %s", slug, sorted(fresh))

    def take_withdrawn(self) -> set[str]:
        """The functions withdrawn since the last call (to remove from the catalog)."""
        with self._withdrawn_lock:
            taken, self.withdrawn = self.withdrawn, set()
        return taken

    @staticmethod
    def _serve(extension: Extension, spec: ToolSpec, settings: BaseModel | None) -> ServedTool:
        options = extension.tool_options.get(spec.name)
        idempotent = spec.idempotent
        if options is not None and options.idempotent is not None:
            idempotent = options.idempotent
        retry = (options.retry if options else None) or spec.retry
        if retry is not None and not idempotent:
            raise ConfigurationError(
                f"extension {extension.slug!r}: tool {spec.name} declares retries but is not "
                "idempotent (a retried tool may run twice)"
            )
        isolation = (
            (options.isolation if options else None) or spec.isolation or extension.isolation
        )
        if isolation not in ("thread", "process"):
            raise ConfigurationError(f"tool {spec.name}: isolation must be thread or process")
        return ServedTool(
            function=extension.function_name(spec.name),
            spec=spec,
            extension=extension,
            queue=extension.queue_name,
            timeout_s=(options.timeout if options else None)
            or spec.timeout_s
            or extension.timeout_s,
            settings=settings,
            idempotent=idempotent,
            isolation=isolation,
            retry=retry,
            concurrency=options.concurrency if options else None,
            breaker=options.breaker if options else None,
            result_shaping=(options.result_shaping if options else None) or "error",
        )

    def add_extensions(self, extensions: Iterable[tuple[str, Extension]]) -> None:
        """Add several; a bad one is recorded in :attr:`errors`, logged, and skipped.

        One this host cannot serve (its preflight says why, e.g. the python tool without
        bubblewrap) is recorded the same way but logged at :attr:`unservable_log_level`
        (a warning by default), not as an error: the extension is fine, the host lacks
        something, and the workers report it (``extensions check``, the catalog's
        extension errors).
        """
        extensions = list(extensions)
        self._begin_mcp([extension for _, extension in extensions])
        for source, extension in extensions:
            try:
                if extension.mcp is None:
                    extension.validate()
                unservable = extension.preflight() if extension.preflight is not None else None
                if unservable:  # the host lacks something (bubblewrap): not the extension's fault
                    unservable = self.redactor.scrub(unservable)
                    self.errors[source] = f"extension {extension.slug!r}: {unservable}"
                    log.log(self.unservable_log_level, _UNSERVABLE, source, unservable)
                    continue
                self._add(extension)
            except ConfigurationError as exc:
                self.errors[source] = self.redactor.scrub(str(exc))
                log.error("extension %s skipped: %s", source, self.errors[source])

    def pinned_elsewhere(self, request: ToolCallRequest) -> bool:
        """True when ``request`` is pinned to a schema another live worker serves, not this.

        A rolling upgrade changed the function's schema, and a worker of the version the
        call was pinned to still serves it: the call is handed back to its queue for that
        worker, not refused. O(1).
        """
        asked = request.schema_hash
        served = self.served.get(request.function)
        if asked is None or served is None or asked == served.schema_hash:
            return False
        return asked in self.live_schemas.get(request.function, ())

    @property
    def queues(self) -> set[str]:
        """The queues of every served function."""
        return {s.queue for s in self.served.values()}

    @property
    def affinity_queues(self) -> set[str]:
        """The queues of every served function with session affinity."""
        return {s.queue for s in self.served.values() if s.spec.affinity == "conversation"}

    @property
    def needs_processes(self) -> bool:
        """True when any served function runs in ``process`` isolation."""
        return any(s.isolation == "process" for s in self.served.values())

    def refresh_tool_states(self) -> dict[str, tuple[bool, str | None]]:
        """Ask each tool whether it is enabled and for its preparation text, now.

        Called at every catalog refresh (a tool's ``is_enabled()`` may change at run
        time); a probe that raises counts as disabled (logged). The result is kept in
        :attr:`tool_states` for :meth:`refusal`.

        Returns:
            ``{function: (enabled, preparation text or None)}``.
        """
        states: dict[str, tuple[bool, str | None]] = {}
        for function, served in self.served.items():
            states[function] = (self._probe_enabled(served), self._probe_preparation(served))
        self.tool_states = states
        self._entries = {}
        return states

    @staticmethod
    def _probe_enabled(served: ServedTool) -> bool:
        if served.spec.is_enabled is None:
            return True
        try:
            return served.spec.is_enabled()
        except Exception:  # noqa: BLE001 - a broken probe disables its tool, nothing else
            log.warning("%s: is_enabled() failed; the tool is disabled", served.function,
                        exc_info=True)  # fmt: skip
            return False

    def _probe_preparation(self, served: ServedTool) -> str | None:
        if served.spec.preparation is None:
            return None
        try:
            text = served.spec.preparation()
        except Exception:  # noqa: BLE001 - a description never fails anything
            log.warning("%s: preparation description failed", served.function, exc_info=True)
            return None
        return self.redactor.scrub(text)[:1000] if text else None

    def catalog_entry(self, served: ServedTool) -> CatalogEntry:
        """The catalog entry of ``served`` as of the last :meth:`refresh_tool_states`.

        Built once per refresh (and on first use before any refresh).
        """
        cached = self._entries.get(served.function)
        if cached is not None and cached[0] is served:
            return cached[1]
        state = self.tool_states.get(served.function)
        if state is None:
            state = (self._probe_enabled(served), None)
        entry = served.catalog_entry(enabled=state[0], preparation=state[1])
        self._entries[served.function] = (served, entry)
        return entry

    def close(self) -> None:
        """Close the MCP sessions (at drain)."""
        if self.mcp is not None:
            self.mcp.close()

    def context(
        self,
        served: ServedTool,
        fields: Mapping[str, Any],
        progress_sink: Callable[[str], None] | None = None,
    ) -> ExtensionContext:
        """The context one call of ``served`` runs with.

        The extension's logger is muted while its declared ``logging`` switch is off;
        the context's ``switches`` answer from :attr:`switches` (declared defaults for
        states Redis does not hold).

        Args:
            served: the function called.
            fields: the :data:`PLAIN_CONTEXT_FIELDS` of the call (``slug`` and ``version``
                are the extension's when absent).
            progress_sink: where the tool's progress messages go, if anywhere.
        """
        extension = served.extension
        logger = logging.getLogger(f"toolfleet.extensions.{extension.slug}")
        if any(s.name == "logging" for s in extension.switches):
            logger.disabled = not self.switches.is_on(extension.switch_name("logging"))

        def switch_is_active(name: str) -> bool:
            return self.switches.is_on(extension.switch_name(name))

        return ExtensionContext(
            **{"slug": extension.slug, "version": extension.version, **fields},
            logger=logger,
            settings=served.settings,
            switches=switch_is_active,
            progress_sink=progress_sink,
        )
