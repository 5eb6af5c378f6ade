"""``run_tool``: one call answered as a worker answers it, with no Redis and no fleet."""

from __future__ import annotations

from typing import Any

from toolfleet.producer._core.calls import (
    arguments_size,
    build_request,
    check_timeout,
    make_context,
)
from toolfleet.shared import codec
from toolfleet.shared.settings import Settings
from toolfleet.shared.wire import CallContext, ReplyEnvelope, ToolCallRequest, ToolCallResult
from toolfleet.testing._sources import ExtensionSource, load_source
from toolfleet.worker.pipeline.calls import CallPipeline
from toolfleet.worker.registry.redaction import Redactor
from toolfleet.worker.registry.registry import Registry

__all__ = ["run_tool"]

#: The ``worker`` field of a result answered by :func:`run_tool`.
WORKER_ID = "toolfleet.testing"


def run_tool(
    extension_or_tool: ExtensionSource,
    name: str,
    arguments: dict[str, Any] | str | None = None,
    *,
    context: CallContext | dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> ToolCallResult:
    """Call one tool in this process exactly as a worker would, and return what the model reads.

    The call takes the worker's own path (:class:`~toolfleet.worker.pipeline.calls.CallPipeline`):
    the request is built as ``ToolClient.call`` builds it and goes through the wire
    encoding; the arguments are parsed and validated by the worker's rules
    (``invalid_arguments`` names each bad argument); the tool runs under the worker's time
    limit (``timeout`` at the limit, even when the tool is stuck); an ``ExtensionToolError``
    becomes ``tool_error`` with its message, any other exception ``crashed`` (traceback
    logged); secret setting values are scrubbed; the result is encoded as a reply and
    decoded as the producer decodes it. Switches take their declared defaults and the
    extension's settings come from the environment (``TOOLFLEET_EXT_<SLUG>_<NAME>``), as
    in a worker that Redis holds no switch states for.

    Differences from a fleet, on purpose: nothing is queued, so no ``not_available`` for
    want of a worker, no quota, concurrency limit or breaker; ``process``-isolation tools
    run on a thread of this process (their time limit holds, but a stuck one keeps its
    thread); use the ``toolfleet_fleet`` fixture to test those.

    Args:
        extension_or_tool: an :class:`~toolfleet.shared.Extension`, a single tool definition
            (any style: a ``Tool`` class, a metadata plugin, a toolkit, a delegate), a
            ``"MODULE:ATTR"`` string as ``toolfleet worker --extension`` takes, or the path of
            an extension folder (a ``Path``, or a string naming a directory).
        name: the tool's name in its extension (``"add_days"``) or its wire function name
            (``"ext_date_calculator_add_days"``); a name the extension does not serve is
            answered ``unknown_function``.
        arguments: a dict, the raw JSON string a model wrote, or ``None`` (``{}``).
        context: the call's :class:`~toolfleet.shared.CallContext` or a dict of its fields
            (``account``, ``user``, ``conversation``, ``metadata``...).
        timeout_s: the caller's budget in seconds, as ``ToolClient.call(timeout_s=...)``
            takes it: the tool's limit is ``min(tool timeout, timeout_s + 0.5)``, the
            worker's grace past a deadline. ``None``: the tool's own time limit.

    Returns:
        The :class:`~toolfleet.shared.ToolCallResult`: ``status`` and ``content`` (the
        tool's JSON result, or ``{"error": "<message>"}``) as the model reads them.

    Raises:
        ConfigurationError: the extension does not load or is invalid (what a worker logs
            and skips).
        ClientError: ``arguments`` that are not JSON (a set, NaN), a bad ``context`` or
            ``timeout_s`` (what ``ToolClient.call`` raises for them).
        ImportError, AttributeError, TypeError: ``extension_or_tool`` names no extension.
    """
    extension = load_source(extension_or_tool)
    settings = Settings.from_env()
    registry = Registry(
        settings.namespace,
        secrets_dir=settings.secrets_dir,
        redactor=Redactor(settings.secret_values()),
    )
    try:
        registry.add_extension(extension)
        function = _function_of(registry, name)
        served = registry.served.get(function)
        budget = timeout_s
        if budget is None:
            budget = served.timeout_s if served is not None else settings.default_timeout_s
        request = build_request(
            function,
            arguments,
            tool_call_id=None,
            context=make_context(context),
            timeout_s=check_timeout(budget),
            reply_to=WORKER_ID,
        )
        arguments_size(request)  # arguments that are not JSON: ClientError, as from a client
        pipeline = CallPipeline(
            registry,
            worker_id=WORKER_ID,
            max_result_bytes=settings.max_result_bytes,
            max_arguments_bytes=settings.max_arguments_bytes,
        )
        try:
            return _answer(pipeline, request)
        finally:
            pipeline.close()
    finally:
        registry.close()


def _function_of(registry: Registry, name: str) -> str:
    """The wire function ``name`` means: a served function, or a tool's plain name."""
    if name in registry.served:
        return name
    for function, served in registry.served.items():
        if served.spec.name == name:
            return function
    return name


def _answer(pipeline: CallPipeline, sent: ToolCallRequest) -> ToolCallResult:
    """The reply a worker posts to ``sent``, decoded as the producer decodes it."""
    data = sent.encode()
    request = ToolCallRequest.decode(data)  # what the worker reads off the queue
    result = pipeline.admit(request, len(data)) or pipeline.call(request)
    try:
        reply = ReplyEnvelope(type="result", result=result).encode()
    except codec.EncodeError:
        reply = ReplyEnvelope(type="result", result=pipeline.unencodable(request)).encode()
    decoded = ReplyEnvelope.decode(reply).result
    assert decoded is not None  # a result envelope always carries its result
    return decoded
