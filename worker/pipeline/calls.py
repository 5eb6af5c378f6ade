"""The toolkit: the functions one worker process serves, and how one call is answered."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from toolfleet.shared import codec
from toolfleet.shared.catalog import CatalogEntry, refusal
from toolfleet.shared.errors import (
    ConfigurationError,
    InvalidArgumentsError,
    ToolCallError,
)
from toolfleet.shared.naming import function_names
from toolfleet.shared.spec import ToolSpec
from toolfleet.shared.tool import Extension, ExtensionContext
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult, ToolEvent
from toolfleet.worker.isolation.base import CallHandle, ChildToolError, Outcome
from toolfleet.worker.isolation.inproc import InProcessRunner
from toolfleet.worker.pipeline.arguments import parse_arguments
from toolfleet.worker.pipeline.redaction import Redactor
from toolfleet.worker.pipeline.surrogates import replace_lone_surrogates
from toolfleet.worker.registry.extension_settings import load_settings, secret_values
from toolfleet.worker.registry.served_tool import ServedTool
from toolfleet.worker.registry.switches import SwitchBoard

if TYPE_CHECKING:
    from toolfleet.worker.isolation.process import ProcessRunner
    from toolfleet.worker.mcp.servers import McpServers
    from toolfleet.worker.tenancy.gate import Gate

__all__ = ["CRASH_MESSAGE", "DEADLINE_GRACE_S", "Toolkit"]

log = logging.getLogger("toolfleet.worker")

#: What the model reads when a tool fails unexpectedly (the traceback stays in the log).
CRASH_MESSAGE = "the tool failed unexpectedly; the error was logged (ref {ref})"
_CLASH = "%s clashes with another extension's tool: served as %s"
#: Seconds past the caller's deadline a call bound by it may run: the producer resolves it
#: at the deadline and marks it resolved, so the worker's own ``timeout`` is not posted.
DEADLINE_GRACE_S = 0.5

#: Seconds between two progress events of one call (more are dropped).
PROGRESS_INTERVAL_S = 0.2

#: ExtensionContext fields that travel to a child process as plain values.
_PLAIN_CONTEXT_FIELDS = (
    "call_id", "function", "slug", "version", "deadline", "tool_call_id", "account", "user",
    "llmclient", "conversation", "traceparent", "metadata",
)  # fmt: skip


class Toolkit:
    """The functions served by this process, and the call pipeline.

    ``call(request)`` returns exactly one :class:`ToolCallResult` and never raises:
    deadline check (``expired``), lookup (``unknown_function``), enabled / switched on /
    available to the account (``not_available``), argument parsing and validation
    (``invalid_arguments``), then the run under ``min(tool timeout_s, deadline - now)``
    in the tool's isolation (``ok``, ``tool_error``, ``crashed``, ``timeout``,
    ``canceled``), with retries only for idempotent tools that declare them. Secret
    setting values are scrubbed from every reply; a result over ``max_result_bytes``
    becomes a ``tool_error``.

    Args:
        worker_id: ``host:pid`` written into every result.
        namespace: key prefix (for switches).
        secrets_dir: folder of mounted secret files for extension settings.
        max_result_bytes: largest encoded result posted, bytes.
        start_mcp: start the MCP servers of MCP extensions (off in ``process``-isolation
            children, which never run MCP tools: those skip MCP extensions).

    Attributes:
        served: function name -> :class:`ServedTool`.
        errors: extension source -> why it was not loaded.
        running: request id -> :class:`CallHandle` of calls running now.
        process_runner: runs ``process``-isolation tools (set by the worker process).
        emit: posts a status event of a call to its reply list (set by the worker
            process); used only for requests with ``events`` on.
        affinity_routes: queue -> the queue only this process's slot consumes, for the
            queues of tools with session affinity (set by the worker process); results
            of a conversation's calls to those tools name it as their ``route``.
        mcp: the MCP sessions of this process (``None`` until an MCP extension loads).
        withdrawn: functions an MCP server stopped offering, to remove from the catalog.
    """

    def __init__(
        self,
        worker_id: str = "",
        runner: InProcessRunner | None = None,
        *,
        namespace: str = "toolfleet",
        secrets_dir: Path | None = None,
        max_result_bytes: int = 1_048_576,
        start_mcp: bool = True,
    ) -> None:
        self.served: dict[str, ServedTool] = {}
        self.extensions: dict[str, Extension] = {}
        self.errors: dict[str, str] = {}
        self.worker_id = worker_id
        self.runner = runner or InProcessRunner()
        self.process_runner: ProcessRunner | None = None
        self.secrets_dir = secrets_dir
        self.max_result_bytes = max_result_bytes
        self.switches = SwitchBoard(namespace)
        self.redactor = Redactor()
        self.running: dict[str, CallHandle] = {}
        self.tool_states: dict[str, tuple[bool, str | None]] = {}
        self._entries: dict[str, tuple[ServedTool, CatalogEntry]] = {}
        self.affinity_routes: dict[str, str] = {}
        self._running_lock = threading.Lock()
        self.emit: Callable[[ToolCallRequest, ToolEvent], None] | None = None
        self.start_mcp = start_mcp
        self.mcp: McpServers | None = None
        self.withdrawn: set[str] = set()
        self._withdrawn_lock = threading.Lock()
        self._settings: dict[str, BaseModel | None] = {}
        #: fleet-wide concurrency limits and breakers (set by the worker process)
        self.gate: Gate | None = None

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
        if extension.slug in self.extensions:
            raise ConfigurationError(f"extension {extension.slug!r} is loaded already")
        settings = load_settings(extension, self.secrets_dir)
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
        self.redactor.add(secret_values(settings))
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
                self._mcp_servers().begin(extension, settings)
            except ConfigurationError:
                continue  # add_extension reports it

    def _note_tool_problems(self, slug: str, problems: list[str]) -> None:
        source = f"MCP tools of {slug}"
        if problems:
            self.errors[source] = "; ".join(problems)
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

    def close(self) -> None:
        """Close the MCP sessions and stop the event loop (at drain)."""
        if self.mcp is not None:
            self.mcp.close()
        self.runner.close()

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
        )

    def add_extensions(self, extensions: Iterable[tuple[str, Extension]]) -> None:
        """Add several; a bad one is recorded in :attr:`errors`, logged, and skipped."""
        extensions = list(extensions)
        self._begin_mcp([extension for _, extension in extensions])
        for source, extension in extensions:
            try:
                self.add_extension(extension)
            except ConfigurationError as exc:
                self.errors[source] = str(exc)
                log.error("extension %s skipped: %s", source, exc)

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

    # -- calls -----------------------------------------------------------------

    def cancel(self, call_id: str) -> bool:
        """Cancel a running call; False when it is not running here."""
        with self._running_lock:
            handle = self.running.get(call_id)
        return handle.cancel() if handle is not None else False

    def call(self, request: ToolCallRequest) -> ToolCallResult:
        """Answer one request (never raises)."""
        started = time.time()
        timings: dict[str, Any] = {
            "queued_s": max(0.0, started - request.sent_at),
            "worker": self.worker_id,
        }
        if request.deadline <= started:
            return self._failure(
                request, Status.EXPIRED, "the call's deadline passed before it could run", timings
            )
        served = self.served.get(request.function)
        entry = None if served is None else self.catalog_entry(served)
        refused = refusal(request.function, entry, self.switches.states, request.context.account)
        if refused is not None:
            return self._failure(request, refused.status, refused.message, timings)
        assert served is not None  # without an entry the rule answers unknown_function
        try:
            arguments = parse_arguments(request.arguments, served.arguments_model)
        except InvalidArgumentsError as exc:
            return self._failure(request, Status.INVALID_ARGUMENTS, str(exc), timings)
        handle = CallHandle()
        with self._running_lock:
            self.running[request.id] = handle
        try:
            self._running_event(request, served, arguments)

            def run() -> ToolCallResult:
                return self._run_with_retries(request, served, arguments, handle, timings)

            result = run() if self.gate is None else self.gate.guard(request, served, run, timings)
            stage = {Status.OK: "completed", Status.CANCELED: "canceled"}.get(result.status)
            if stage is not None and served.spec.describe is not None:
                description = self._describe(served, stage, arguments, result.content)
                result = result.model_copy(update={"description": description})
            route = self.affinity_routes.get(served.queue)
            if route and request.context.conversation and served.spec.affinity:
                result = result.model_copy(update={"route": route})
            return result
        finally:
            with self._running_lock:
                self.running.pop(request.id, None)

    def _running_event(
        self, request: ToolCallRequest, served: ServedTool, arguments: BaseModel
    ) -> None:
        if not request.events or self.emit is None:
            return
        running = self._describe(served, "running", arguments, None)
        canceled = self._describe(served, "canceled", arguments, None)
        self._event(request, "running", running, canceled_description=canceled)

    def _event(
        self,
        request: ToolCallRequest,
        kind: str,
        description: str | None,
        *,
        canceled_description: str | None = None,
    ) -> None:
        if not request.events or self.emit is None:
            return
        event = ToolEvent(
            id=request.id,
            kind=kind,  # type: ignore[arg-type]
            description=description,
            canceled_description=canceled_description,
        )
        try:
            self.emit(request, event)
        except Exception:  # noqa: BLE001 - an event is best effort; the result still goes out
            log.warning("could not post a %s event for %s", kind, request.id, exc_info=True)

    def _describe(
        self, served: ServedTool, stage: str, arguments: BaseModel, result: Any
    ) -> str | None:
        if served.spec.describe is None:
            return None
        try:
            text = served.spec.describe(stage, arguments, result)
        except Exception:  # noqa: BLE001 - a description never fails a call
            log.warning("%s: %s_description failed", served.function, stage, exc_info=True)
            return None
        return self.redactor.scrub(text) if text else None

    def _progress_sink(self, request: ToolCallRequest) -> Callable[[str], None] | None:
        if not request.events or self.emit is None:
            return None
        last = [0.0]

        def progress(message: str) -> None:
            now = time.monotonic()
            if now - last[0] < PROGRESS_INTERVAL_S:
                return
            last[0] = now
            self._event(request, "progress", self.redactor.scrub(str(message))[:1000])

        return progress

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

    def _run_with_retries(
        self,
        request: ToolCallRequest,
        served: ServedTool,
        arguments: BaseModel,
        handle: CallHandle,
        timings: dict[str, Any],
    ) -> ToolCallResult:
        attempt = 1
        run_s = 0.0
        while True:
            limit_s = min(served.timeout_s, request.deadline - time.time() + DEADLINE_GRACE_S)
            context = self._context_for(request, served)
            handle.on_cancel(context.canceled_event.set)
            outcome = self._run(served, arguments, context, limit_s, handle)
            if outcome.timed_out:
                context.canceled_event.set()
            run_s += outcome.run_s
            timings["run_s"] = run_s
            result = self._result_of(request, outcome, limit_s, timings)
            retry = served.retry
            if retry is None or attempt >= retry.attempts or result.status.value not in retry.on:
                return result
            backoff = retry.backoff_s * 2 ** (attempt - 1)
            if time.time() + backoff >= request.deadline or handle.canceled_within(backoff):
                return result
            log.info("retrying %s (call %s), attempt %d", served.function, request.id, attempt + 1)
            attempt += 1

    def _run(
        self,
        served: ServedTool,
        arguments: BaseModel,
        context: ExtensionContext,
        limit_s: float,
        handle: CallHandle,
    ) -> Outcome:
        if served.isolation == "process" and self.process_runner is not None:
            fields = {name: getattr(context, name) for name in _PLAIN_CONTEXT_FIELDS}
            return self.process_runner.run(
                served.function,
                arguments.model_dump(mode="python", by_alias=True, exclude_unset=True),
                fields,
                self.switches.snapshot(),
                limit_s,
                handle,
            )
        invoke = served.spec.invoke
        if served.is_async:
            return self.runner.run_async(lambda: invoke(arguments, context), limit_s, handle)
        return self.runner.run_sync(lambda: invoke(arguments, context), limit_s, handle)

    def _result_of(
        self,
        request: ToolCallRequest,
        outcome: Outcome,
        limit_s: float,
        timings: dict[str, Any],
    ) -> ToolCallResult:
        if outcome.canceled:
            return self._failure(request, Status.CANCELED, "the call was canceled", timings)
        if outcome.timed_out:
            message = f"the tool did not finish within {limit_s:.3g} s"
            return self._failure(request, Status.TIMEOUT, message, timings)
        error = outcome.error
        # a tool answers a status by raising its error class (ExtensionToolError: tool_error,
        # ToolTimeoutError from a tool enforcing its own limit: timeout); anything else crashed
        raised = error.status if isinstance(error, ToolCallError) else None
        if raised is not None and raised is not Status.OK:
            return self._failure(request, raised, str(error), timings)
        if error is not None:
            return self._crashed(request, error, timings)
        value = outcome.value
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        try:
            value = replace_lone_surrogates(self.redactor.scrub_json(value))
            size = len(codec.dumps(value))
        except (codec.EncodeError, codec.DecodeError) as exc:
            return self._crashed(request, exc, timings)
        if size > self.max_result_bytes:
            from toolfleet.worker.supervision import (
                metrics,  # not at import: the CLI loads this module
            )

            metrics.OVERSIZE.labels("result").inc()
            message = (
                f"the result is {size} bytes, over the limit of {self.max_result_bytes} bytes; "
                "ask for less (narrow the query or paginate)"
            )
            return self._failure(request, Status.TOOL_ERROR, message, timings)
        return ToolCallResult(
            id=request.id,
            tool_call_id=request.tool_call_id,
            function=request.function,
            status=Status.OK,
            content=value,
            **timings,
        )

    def _failure(
        self, request: ToolCallRequest, status: Status, message: str, timings: dict[str, Any]
    ) -> ToolCallResult:
        return ToolCallResult.failure(request, status, self.redactor.scrub(message), **timings)

    def _crashed(
        self, request: ToolCallRequest, error: BaseException, timings: dict[str, Any]
    ) -> ToolCallResult:
        if isinstance(error, ChildToolError):
            log.error("tool %s crashed in its process (call %s): %s", request.function,
                      request.id, error)  # fmt: skip
        else:
            log.error(
                "tool %s crashed (call %s)",
                request.function,
                request.id,
                exc_info=(type(error), error, error.__traceback__),
            )
        return ToolCallResult.failure(
            request, Status.CRASHED, CRASH_MESSAGE.format(ref=request.id), **timings
        )

    def _context_for(self, request: ToolCallRequest, served: ServedTool) -> ExtensionContext:
        ctx = request.context
        extension = served.extension
        logger = logging.getLogger(f"toolfleet.extensions.{extension.slug}")
        if any(s.name == "logging" for s in extension.switches):
            logger.disabled = not self.switches.is_on(extension.switch_name("logging"))

        def switch_is_active(name: str) -> bool:
            return self.switches.is_on(extension.switch_name(name))

        return ExtensionContext(
            call_id=request.id,
            tool_call_id=request.tool_call_id,
            function=request.function,
            slug=extension.slug,
            version=extension.version,
            deadline=request.deadline,
            account=ctx.account,
            user=ctx.user,
            llmclient=ctx.llmclient,
            conversation=ctx.conversation,
            traceparent=ctx.traceparent,
            metadata=dict(ctx.metadata),
            logger=logger,
            settings=served.settings,
            switches=switch_is_active,
            progress_sink=self._progress_sink(request),
        )
