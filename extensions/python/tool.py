"""The ``run`` tool: arguments, result, and how a call is timed and stopped.

Why ``async def call``: the worker runs an async tool on its event loop and *cancels*
it at the time limit (``min(timeout_s, deadline - now)``), answering ``timeout`` at
that moment. The cancellation reaches :meth:`Run.call` inside an ``await``, where the
handler kills the interpreter's process group at once, so nothing runs past the
limit and the worker's threads are never held. A sync tool is only abandoned at the
limit: it would need its own timer, racing the worker's, and end either before the
limit (an ``ok`` reply instead of ``timeout``) or after it (the child still running).

The tool also kills the interpreter itself at ``context.deadline`` (or its own
``timeout_s``, whichever is first), for callers that do not cancel it. Under the
worker both moments coincide at most (the worker's limit is never later, but its
timer may fire a few milliseconds after the deadline's): when the tool's own timer
wins, the call waits up to :data:`CANCEL_GRACE_S` for the worker's cancellation, so
the reply is still ``timeout``; a caller that never cancels gets
:class:`ToolTimeoutError` after that grace.
"""

from __future__ import annotations

import asyncio
import time
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from toolfleet.extensions.python._interpreter import InterpreterTimeout
from toolfleet.extensions.python._sessions import SessionPool
from toolfleet.extensions.python.config import PythonToolConfig
from toolfleet.shared.errors import ToolTimeoutError
from toolfleet.shared.tool import ExtensionContext, Tool

__all__ = [
    "CANCEL_GRACE_S",
    "DEFAULT_TIMEOUT_S",
    "MAX_CODE_CHARS",
    "Run",
    "RunArguments",
    "RunOutput",
    "describe",
    "session_key",
]

#: Default wall-clock limit of one call, seconds.
DEFAULT_TIMEOUT_S = 30.0
#: Seconds to wait for the worker's cancellation after the tool's own deadline passed.
CANCEL_GRACE_S = 0.5
#: Longest accepted source, characters.
MAX_CODE_CHARS = 100_000


class RunArguments(BaseModel):
    """Arguments of ``run``."""

    model_config = ConfigDict(extra="forbid")

    code: str = Field(
        min_length=1,
        max_length=MAX_CODE_CHARS,
        description=(
            'Python source to execute, e.g. "import math\\nmath.factorial(20)". '
            "Statements run in order in the conversation's interpreter; the value of a "
            "final expression comes back as `result` (its repr), as in a REPL. Use "
            "print() for anything else you want to see."
        ),
    )


class RunOutput(BaseModel):
    """What ``run`` returns (the JSON object the model reads)."""

    stdout: str = Field(description="Everything the code wrote to standard output.")
    stderr: str = Field(description="Everything it wrote to standard error, and notes.")
    result: str | None = Field(description="repr of the final expression's value, or null.")
    error: str | None = Field(
        description='"ExcType: message" and the traceback of the code, or null.'
    )


def describe(config: PythonToolConfig, timeout_s: float) -> str:
    """The description the model reads, with the limits of ``config`` filled in."""
    return (
        "Run Python 3 code in a sandboxed, persistent interpreter (like a Jupyter "
        "cell) and get back {stdout, stderr, result, error}: `result` is the repr of "
        "the value of the last expression (null if none), `error` is the exception "
        "with its traceback (null if none). Variables, functions and imports persist "
        "between calls of the same conversation while the interpreter lives; it may be "
        "restarted (after a time-out or crash, after inactivity, or when another "
        "server takes the call), and then earlier state is gone: redefine what you "
        "need. Limits per call: "
        f"{timeout_s:g} s wall clock, {config.cpu_s:g} s CPU, "
        f"{config.memory_bytes // 2**20} MiB memory; each output is cut to "
        f"{config.max_output_bytes} bytes (the middle is left out). No input is "
        "available (stdin is empty); files go to a private temporary directory "
        f"(at most {config.disk_bytes // 2**20} MiB in all). The "
        "standard library is available; other packages only if installed."
    )


class Run(Tool):
    """Run Python code in a sandboxed interpreter kept per conversation.

    Subclasses made by :func:`toolfleet.extensions.python.make_extension` carry their
    own :attr:`config`, ``timeout_s`` and session pool.

    Attributes:
        config: sandbox limits and session policy.
    """

    name = "run"
    arguments_model = RunArguments
    timeout_s: ClassVar[float | None] = DEFAULT_TIMEOUT_S
    description: ClassVar[str | None] = describe(PythonToolConfig(), DEFAULT_TIMEOUT_S)
    config: ClassVar[PythonToolConfig] = PythonToolConfig()
    affinity: ClassVar[str | None] = "conversation"  # follow-ups reach this interpreter
    _pool: ClassVar[SessionPool | None] = None

    @classmethod
    def pool(cls) -> SessionPool:
        """This class's session pool (made on first use; one per worker process)."""
        pool = cls.__dict__.get("_pool")
        if pool is None:
            pool = SessionPool(cls.config)
            cls._pool = pool
        assert isinstance(pool, SessionPool)
        return pool

    async def call(self, arguments: RunArguments, context: ExtensionContext) -> RunOutput:
        """Run ``arguments.code`` in the conversation's interpreter.

        Exceptions raised by the code are part of the result (``error``), not failures
        of the tool.

        Raises:
            ToolTimeoutError: the deadline passed and no one cancelled the call.
        """
        loop = asyncio.get_running_loop()
        limit_s = context.deadline - time.time()
        if self.timeout_s is not None:
            limit_s = min(limit_s, self.timeout_s)
        try:
            cell = await self.pool().run(
                session_key(context),
                arguments.code,
                deadline=loop.time() + limit_s,
                lost=context.session_lost,
            )
        except InterpreterTimeout:
            await asyncio.sleep(CANCEL_GRACE_S)  # the worker's cancellation answers `timeout`
            raise ToolTimeoutError(f"the code did not finish within {limit_s:.3g} s") from None
        return RunOutput(
            stdout=cell.stdout, stderr=cell.stderr, result=cell.result, error=cell.error
        )


def session_key(context: ExtensionContext) -> str | None:
    """The session of a call: its account and conversation; ``None`` without a conversation.

    The account is part of the key because conversation ids are chosen by each
    platform and need not be unique across customers.
    """
    if context.conversation is None:
        return None
    return f"{context.account or ''}\x00{context.conversation}"
