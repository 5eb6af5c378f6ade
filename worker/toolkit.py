"""The toolkit: the functions one worker process serves, and how one call is answered."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from toolfleet.shared import codec
from toolfleet.shared.errors import ConfigurationError, ExtensionToolError, InvalidArgumentsError
from toolfleet.shared.tool import Extension, ExtensionContext
from toolfleet.shared.wire import Status, ToolCallRequest, ToolCallResult
from toolfleet.worker.arguments import parse_arguments
from toolfleet.worker.runner import Outcome, Runner
from toolfleet.worker.spec import ToolSpec, specs_of

__all__ = ["CRASH_MESSAGE", "Toolkit"]

log = logging.getLogger("toolfleet.worker")

#: What the model reads when a tool fails unexpectedly (the traceback stays in the log).
CRASH_MESSAGE = "the tool failed unexpectedly; the error was logged (ref {ref})"


class Toolkit:
    """The functions served by this process, and the call pipeline.

    ``call(request)`` returns exactly one :class:`ToolCallResult` and never raises:
    deadline check (``expired``), lookup (``unknown_function``), argument parsing and
    validation (``invalid_arguments``), then the run under
    ``min(tool timeout_s, deadline - now)`` (``ok``, ``tool_error``, ``crashed``,
    ``timeout``).

    Attributes:
        specs: function name -> :class:`ToolSpec`.
        errors: extension slug or source -> why it was not loaded.
        worker_id: ``host:pid`` written into every result.
    """

    def __init__(self, worker_id: str = "", runner: Runner | None = None) -> None:
        self.specs: dict[str, ToolSpec] = {}
        self.extensions: dict[str, Extension] = {}
        self.errors: dict[str, str] = {}
        self.worker_id = worker_id
        self.runner = runner or Runner()

    def add_extension(self, extension: Extension) -> None:
        """Serve every tool of ``extension``.

        Raises:
            ConfigurationError: the extension is invalid or a function name is taken;
                nothing of it is added then.
        """
        extension.validate()
        specs = specs_of(extension)
        taken = [s.function for s in specs if s.function in self.specs]
        if taken or extension.slug in self.extensions:
            already = ", ".join(taken) or extension.slug
            raise ConfigurationError(f"extension {extension.slug!r}: already served: {already}")
        self.extensions[extension.slug] = extension
        for spec in specs:
            self.specs[spec.function] = spec

    def add_extensions(self, extensions: Iterable[tuple[str, Extension]]) -> None:
        """Add several; a bad one is recorded in :attr:`errors` and skipped."""
        for source, extension in extensions:
            try:
                self.add_extension(extension)
            except ConfigurationError as exc:
                self.errors[source] = str(exc)
                log.error("extension %s skipped: %s", source, exc)

    @property
    def queues(self) -> set[str]:
        """The queues of every served function."""
        return {spec.queue for spec in self.specs.values()}

    def call(self, request: ToolCallRequest) -> ToolCallResult:
        """Answer one request (never raises)."""
        started = time.time()
        queued_s = max(0.0, started - request.sent_at)
        timings: dict[str, Any] = {"queued_s": queued_s, "worker": self.worker_id}
        if request.deadline <= started:
            return ToolCallResult.failure(
                request, Status.EXPIRED, "the call's deadline passed before it could run", **timings
            )
        spec = self.specs.get(request.function)
        if spec is None:
            return ToolCallResult.failure(
                request,
                Status.UNKNOWN_FUNCTION,
                f"unknown function {request.function!r}",
                **timings,
            )
        try:
            arguments = parse_arguments(request.arguments, spec.arguments_model)
        except InvalidArgumentsError as exc:
            return ToolCallResult.failure(request, Status.INVALID_ARGUMENTS, str(exc), **timings)
        limit_s = min(spec.timeout_s, request.deadline - time.time())
        context = _context_for(request, spec)
        outcome = self._run(spec, arguments, context, limit_s)
        return self._result_of(request, spec, outcome, limit_s, timings)

    def _run(
        self, spec: ToolSpec, arguments: Any, context: ExtensionContext, limit_s: float
    ) -> Outcome:
        tool = spec.tool()
        if spec.is_async:
            return self.runner.run_async(lambda: tool.call(arguments, context), limit_s)
        return self.runner.run_sync(lambda: tool.call(arguments, context), limit_s)

    def _result_of(
        self,
        request: ToolCallRequest,
        spec: ToolSpec,
        outcome: Outcome,
        limit_s: float,
        timings: dict[str, Any],
    ) -> ToolCallResult:
        timings["run_s"] = outcome.run_s
        if outcome.timed_out:
            return ToolCallResult.failure(
                request,
                Status.TIMEOUT,
                f"the tool did not finish within {limit_s:.3g} s",
                **timings,
            )
        error = outcome.error
        if isinstance(error, ExtensionToolError):
            return ToolCallResult.failure(request, Status.TOOL_ERROR, str(error), **timings)
        if error is not None:
            return self._crashed(request, error, timings)
        value = outcome.value
        if hasattr(value, "model_dump"):
            value = value.model_dump(mode="json")
        try:
            codec.dumps(value)
        except codec.EncodeError as exc:
            return self._crashed(request, exc, timings)
        return ToolCallResult(
            id=request.id,
            tool_call_id=request.tool_call_id,
            function=request.function,
            status=Status.OK,
            content=value,
            **timings,
        )

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


def _context_for(request: ToolCallRequest, spec: ToolSpec) -> ExtensionContext:
    ctx = request.context
    return ExtensionContext(
        call_id=request.id,
        tool_call_id=request.tool_call_id,
        function=request.function,
        slug=spec.extension.slug,
        version=spec.extension.version,
        deadline=request.deadline,
        account=ctx.account,
        user=ctx.user,
        llmclient=ctx.llmclient,
        conversation=ctx.conversation,
        traceparent=ctx.traceparent,
        metadata=dict(ctx.metadata),
        logger=logging.getLogger(f"toolfleet.extensions.{spec.extension.slug}"),
    )
