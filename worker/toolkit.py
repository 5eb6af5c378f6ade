"""The toolkit: the functions one worker process serves, and how one call is answered."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from toolfleet.shared import codec
from toolfleet.shared.errors import ConfigurationError, ExtensionToolError, InvalidArgumentsError
from toolfleet.shared.tool import Extension, ExtensionContext
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult
from toolfleet.worker.arguments import parse_arguments
from toolfleet.worker.ext_settings import load_settings, secret_values
from toolfleet.worker.redaction import Redactor
from toolfleet.worker.runner import Outcome, Runner
from toolfleet.worker.served import ServedTool
from toolfleet.worker.switches import SwitchBoard

__all__ = ["CRASH_MESSAGE", "Toolkit"]

log = logging.getLogger("toolfleet.worker")

#: What the model reads when a tool fails unexpectedly (the traceback stays in the log).
CRASH_MESSAGE = "the tool failed unexpectedly; the error was logged (ref {ref})"


class Toolkit:
    """The functions served by this process, and the call pipeline.

    ``call(request)`` returns exactly one :class:`ToolCallResult` and never raises:
    deadline check (``expired``), lookup (``unknown_function``), enabled / switched on /
    available to the account (``not_available``), argument parsing and validation
    (``invalid_arguments``), then the run under ``min(tool timeout_s, deadline - now)``
    (``ok``, ``tool_error``, ``crashed``, ``timeout``). Secret setting values are
    scrubbed from every reply.

    Args:
        worker_id: ``host:pid`` written into every result.
        namespace: key prefix (for switches).
        secrets_dir: folder of mounted secret files for extension settings.

    Attributes:
        served: function name -> :class:`ServedTool`.
        errors: extension source -> why it was not loaded.
    """

    def __init__(
        self,
        worker_id: str = "",
        runner: Runner | None = None,
        *,
        namespace: str = "toolfleet",
        secrets_dir: Path | None = None,
    ) -> None:
        self.served: dict[str, ServedTool] = {}
        self.extensions: dict[str, Extension] = {}
        self.errors: dict[str, str] = {}
        self.worker_id = worker_id
        self.runner = runner or Runner()
        self.secrets_dir = secrets_dir
        self.switches = SwitchBoard(namespace)
        self.redactor = Redactor()

    def add_extension(self, extension: Extension) -> None:
        """Serve every tool of ``extension``.

        Raises:
            ConfigurationError: the extension is invalid, its settings do not load, or a
                name is taken; nothing of it is added then.
        """
        specs = extension.validate()
        if extension.slug in self.extensions:
            raise ConfigurationError(f"extension {extension.slug!r} is loaded already")
        settings = load_settings(extension, self.secrets_dir)
        served = [
            ServedTool(
                function=extension.function_name(spec.name),
                spec=spec,
                extension=extension,
                queue=extension.queue_name,
                timeout_s=spec.timeout_s or extension.timeout_s,
                settings=settings,
            )
            for spec in specs
        ]
        taken = [s.function for s in served if s.function in self.served]
        if taken:
            raise ConfigurationError(
                f"extension {extension.slug!r}: function names already served: {', '.join(taken)}"
            )
        self.extensions[extension.slug] = extension
        self.redactor.add(secret_values(settings))
        for switch in extension.switches:
            self.switches.defaults[extension.switch_name(switch.name)] = switch.default
        for item in served:
            self.served[item.function] = item

    def add_extensions(self, extensions: Iterable[tuple[str, Extension]]) -> None:
        """Add several; a bad one is recorded in :attr:`errors`, logged, and skipped."""
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
        if served is None:
            message = f"unknown function {request.function!r}"
            return self._failure(request, Status.UNKNOWN_FUNCTION, message, timings)
        refusal = self._refusal(served, request.context.account)
        if refusal:
            return self._failure(request, Status.NOT_AVAILABLE, refusal, timings)
        try:
            arguments = parse_arguments(request.arguments, served.arguments_model)
        except InvalidArgumentsError as exc:
            return self._failure(request, Status.INVALID_ARGUMENTS, str(exc), timings)
        limit_s = min(served.timeout_s, request.deadline - time.time())
        context = self._context_for(request, served)
        outcome = self._run(served, arguments, context, limit_s)
        if outcome.timed_out:
            context.canceled_event.set()
        return self._result_of(request, outcome, limit_s, timings)

    def _refusal(self, served: ServedTool, account: str | None) -> str:
        if not served.extension.enabled:
            return f"{served.function} is disabled"
        if not all(self.switches.is_on(name) for name in served.switch_names):
            return f"{served.function} is switched off"
        if not served.extension.availability.allows(account):
            return f"{served.function} is not available to this account"
        return ""

    def _run(
        self, served: ServedTool, arguments: BaseModel, context: ExtensionContext, limit_s: float
    ) -> Outcome:
        invoke = served.spec.invoke
        if served.is_async:
            return self.runner.run_async(lambda: invoke(arguments, context), limit_s)
        return self.runner.run_sync(lambda: invoke(arguments, context), limit_s)

    def _result_of(
        self,
        request: ToolCallRequest,
        outcome: Outcome,
        limit_s: float,
        timings: dict[str, Any],
    ) -> ToolCallResult:
        timings["run_s"] = outcome.run_s
        if outcome.timed_out:
            message = f"the tool did not finish within {limit_s:.3g} s"
            return self._failure(request, Status.TIMEOUT, message, timings)
        error = outcome.error
        if isinstance(error, ExtensionToolError):
            return self._failure(request, Status.TOOL_ERROR, str(error), timings)
        if error is not None:
            return self._crashed(request, error, timings)
        value = outcome.value
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        try:
            value = self.redactor.scrub_json(value)
            codec.dumps(value)
        except (codec.EncodeError, codec.DecodeError) as exc:
            return self._crashed(request, exc, timings)
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
        )
