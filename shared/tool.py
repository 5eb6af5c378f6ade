"""The tool protocol: how an extension author writes a tool and groups tools.

A tool is a class::

    class AddDays(Tool):
        \"\"\"Add a number of days to an ISO date.\"\"\"      # the description the model reads

        name = "add_days"
        arguments_model = AddDaysArguments                  # a pydantic model

        def call(self, arguments: AddDaysArguments, context: ExtensionContext) -> str:
            ...                                             # or ``async def call``

and an :class:`~toolfleet.shared.extension.Extension` groups tools under a slug; each
tool's function name is ``ext_<slug>_<name>`` (see
:func:`toolfleet.shared.naming.function_name`). A new tool instance is made for every
call. Raise :class:`ExtensionToolError` for a failure the model should read; any other
exception becomes ``crashed`` with a generic message.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel

from toolfleet.shared.errors import ExtensionToolError
from toolfleet.shared.manifest import RetryPolicy
from toolfleet.shared.naming import FUNCTION_NAME_RE

__all__ = ["ExtensionContext", "ExtensionToolError", "Tool"]


@dataclass
class ExtensionContext:
    """What a tool learns about the call it serves.

    Attributes:
        call_id: the request id (UUID).
        tool_call_id: the model's id for the call, if any.
        function: the function name being called.
        slug: the extension's slug; ``version`` its version.
        account, user, llmclient, conversation, traceparent: from the request context.
        metadata: the request context's free metadata.
        deadline: Unix epoch seconds; the tool is stopped or abandoned by then.
        logger: a logger named ``toolfleet.extensions.<slug>``; silenced while the
            extension declares a ``logging`` switch and it is off.
        settings: the extension's settings (a pydantic model; secrets are ``SecretStr``),
            or ``None`` when it declares none.
        canceled: becomes true when the call is canceled or timed out (a thread tool
            should check it in long loops).
        max_result_bytes: the most bytes the result may take encoded: the call's budget
            (``max_result_bytes=`` on the call) or the worker's limit, the smaller; a tool
            may shape its own result to it (e.g. return fewer rows and a cursor).
            ``None`` outside a worker.
        session_lost: for a tool with session affinity, why the conversation's earlier
            state is not in this process (the process that held it is gone), to tell the
            model; ``None`` otherwise (:mod:`toolfleet.shared.affinity`).
    """

    call_id: str
    function: str
    slug: str
    version: str
    deadline: float
    tool_call_id: str | None = None
    account: str | None = None
    user: str | None = None
    llmclient: str | None = None
    conversation: str | None = None
    traceparent: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    max_result_bytes: int | None = None
    session_lost: str | None = None
    logger: logging.Logger = field(default_factory=lambda: logging.getLogger("toolfleet.tool"))
    settings: Any = None
    switches: Callable[[str], bool] = field(default=lambda name: True, repr=False)
    canceled_event: threading.Event = field(default_factory=threading.Event, repr=False)

    progress_sink: Callable[[str], None] | None = field(default=None, repr=False)

    def progress(self, message: str) -> None:
        """Report progress ("Fetched 3 of 10 pages") to a caller streaming this call.

        Throttled by the worker (at most a few events per second); a no-op when nobody
        streams the call or the tool runs in a child process.
        """
        if self.progress_sink is not None:
            self.progress_sink(message)

    def switch_is_active(self, name: str) -> bool:
        """State of the extension's switch ``name`` (short name, e.g. ``logging``)."""
        return self.switches(name)

    @property
    def canceled(self) -> bool:
        """True once the call was canceled or its time limit passed."""
        return self.canceled_event.is_set()


class Tool:
    """Base class of a tool (the class protocol).

    Class attributes:
        name: the tool's name inside its extension, ``^[a-zA-Z0-9_-]{1,64}$``.
        arguments_model: a pydantic model of the arguments; its JSON schema is what
            the model sees as ``parameters``.
        description: what the model reads; defaults to the class docstring.
        timeout_s: time limit in seconds; ``None`` takes the extension's.
        idempotent: True when running it twice does no harm (it may then be re-run
            after its worker died, and retried when ``retry`` says so).
        isolation: ``thread`` or ``process``; ``None`` takes the extension's.
        retry: a :class:`~toolfleet.shared.manifest.RetryPolicy`, for idempotent tools.
        affinity: ``"conversation"`` for a tool that keeps state in the worker process
            between a conversation's calls: the producer sends the conversation's next
            calls to that process while it lives (:mod:`toolfleet.producer.affinity`).

    Optional, in the shapes other tool frameworks use: ``is_enabled()`` (or
    ``isEnabled()``, or an ``enabled`` attribute) — a tool that answers false is neither
    offered nor run (asked at every catalog refresh); ``preparation_description`` (a
    string, or a method given the tool's name; or ``getPreparationDescription(tool)``) —
    what a UI shows while the model is still writing the call, ``{argument}``
    placeholders filled from the partial arguments (:mod:`toolfleet.shared.preparing`).

    Subclasses implement ``call(self, arguments, context)``, plain or ``async``, and
    return any JSON value (or a pydantic model).
    """

    name: ClassVar[str] = ""
    arguments_model: ClassVar[type[BaseModel] | None] = None
    description: ClassVar[str | None] = None
    timeout_s: ClassVar[float | None] = None
    idempotent: ClassVar[bool] = False
    isolation: ClassVar[str | None] = None
    retry: ClassVar[RetryPolicy | None] = None
    affinity: ClassVar[str | None] = None

    def call(self, arguments: Any, context: ExtensionContext) -> Any:
        """Run the tool. Override in a subclass (sync or ``async def``)."""
        raise NotImplementedError

    def running_description(self, arguments: Any) -> str | None:
        """Optional: what a UI shows while the call runs ("Fetching weather for Paris…")."""
        return None

    def completed_description(self, arguments: Any, result: Any) -> str | None:
        """Optional: what a UI shows when the call succeeded."""
        return None

    def canceled_description(self, arguments: Any) -> str | None:
        """Optional: what a UI shows when the call was canceled."""
        return None

    @classmethod
    def tool_description(cls) -> str:
        """The description the model reads: ``description``, else the cleaned docstring."""
        if cls.description:
            return cls.description
        doc = cls.__doc__ if "__doc__" in cls.__dict__ else None
        return inspect.cleandoc(doc) if doc else ""

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """The JSON schema of ``arguments_model`` (``{"type": "object", ...}``)."""
        if cls.arguments_model is None:
            return {"type": "object", "properties": {}}
        return cls.arguments_model.model_json_schema()

    @classmethod
    def is_async(cls) -> bool:
        """True when ``call`` is a coroutine function."""
        return inspect.iscoroutinefunction(cls.call)

    @classmethod
    def problems(cls) -> list[str]:
        """Reasons this class is not a valid tool (empty when valid)."""
        found: list[str] = []
        if not cls.name:
            found.append("no name")
        elif not FUNCTION_NAME_RE.match(cls.name):
            found.append(f"name {cls.name!r} does not match ^[a-zA-Z0-9_-]{{1,64}}$")
        model = cls.arguments_model
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            found.append("arguments_model is not a pydantic model")
        if cls.call is Tool.call:
            found.append("call(arguments, context) is not implemented")
        elif not _takes_arguments_and_context(cls.call):
            found.append("call must take (self, arguments, context)")
        if not cls.tool_description():
            found.append("no description (docstring or description attribute)")
        if cls.affinity not in (None, "conversation"):
            found.append(f"affinity {cls.affinity!r} must be None or 'conversation'")
        return found


def _takes_arguments_and_context(method: Callable[..., Any]) -> bool:
    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) == 3 or any(p.kind is p.VAR_POSITIONAL for p in params)
