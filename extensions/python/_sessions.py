"""Interpreters kept per conversation, in a bounded LRU with an idle timeout.

One :class:`SessionPool` per tool class and worker process. It is used only from the
event-loop thread the worker runs async tools on, so it needs no thread locks; a
per-session :class:`asyncio.Lock` runs one conversation's calls one after the other
(a model's parallel calls share variables, so they must not interleave).

When an interpreter is stopped for a reason the model cannot see (time limit, crash,
idle timeout, eviction), the reason is remembered and the next call of that
conversation, which gets a fresh interpreter, starts its ``stderr`` with a note.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import replace

from toolfleet.extensions.python._interpreter import CellOutput, Interpreter, wait_tidied
from toolfleet.extensions.python.config import PythonToolConfig

__all__ = ["SessionPool", "fresh_interpreter_note"]

#: Conversations whose lost-interpreter reason is remembered, per pool.
MAX_REMEMBERED = 4096

NAME_ERROR_HINT = (
    "\n(This call ran in a fresh interpreter: names defined by earlier calls are not "
    "available here; define them again.)"
)


def fresh_interpreter_note(reason: str) -> str:
    """The ``stderr`` note of the first call after an interpreter was stopped."""
    return (
        f"[python] Note: this is a fresh Python interpreter; the previous one of this "
        f"conversation was stopped ({reason}). Variables, imports and files from earlier "
        "calls are gone.\n"
    )


class Session:
    """One conversation's interpreter slot (the interpreter is started on first use).

    Attributes:
        interpreter: the live interpreter, or ``None`` before the first call and after
            it was stopped.
        lost_reason: why the previous interpreter was stopped, told once to the model.
        cells: calls run by the current interpreter.
        users: calls holding or waiting for the session; it is stopped for idleness
            or room only when there are none.
    """

    def __init__(self, config: PythonToolConfig, lost_reason: str | None = None) -> None:
        self.config = config
        self.loop = asyncio.get_running_loop()
        self.lock = asyncio.Lock()
        self.interpreter: Interpreter | None = None
        self.lost_reason = lost_reason
        self.cells = 0
        self.users = 0
        self.idle_timer: asyncio.TimerHandle | None = None

    async def run(self, code: str, *, deadline: float) -> CellOutput:
        """Run ``code``, starting an interpreter first when there is none (hold :attr:`lock`).

        Raises:
            InterpreterTimeout: ``deadline`` (event-loop time) passed; the interpreter
                was killed.
            asyncio.CancelledError: the call was cancelled; the interpreter was killed.
        """
        if self.interpreter is not None and not self.interpreter.alive:
            self.stop("it exited between calls")
        note = ""
        if self.interpreter is None:
            self.interpreter = await Interpreter.start(self.config)
            self.cells = 0
            if self.lost_reason:
                note = fresh_interpreter_note(self.lost_reason)
                self.lost_reason = None
        fresh = self.cells == 0
        try:
            output = await self.interpreter.execute(
                code, deadline=deadline, cpu_s=self.config.cpu_s
            )
        except BaseException:  # InterpreterTimeout, or cancelled at the worker's limit
            self.stop("a call ran past its time limit")
            raise
        self.cells += 1
        if output.lost:
            self.stop(output.lost)
        error = output.error
        if fresh and error and error.startswith("NameError"):
            error += NAME_ERROR_HINT
        return replace(output, stderr=note + output.stderr, error=error)

    def stop(self, reason: str) -> None:
        """Kill the interpreter (if any) and remember ``reason`` for the next call."""
        if self.idle_timer is not None:
            self.idle_timer.cancel()
            self.idle_timer = None
        if self.interpreter is not None:
            self.interpreter.kill()
            self.interpreter = None
            self.lost_reason = reason


class SessionPool:
    """Sessions by conversation key, at most ``config.max_sessions`` of them.

    Args:
        config: limits of the interpreters and the pool's size and idle timeout.
    """

    def __init__(self, config: PythonToolConfig) -> None:
        self.config = config
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._lost: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    async def run(
        self, key: str | None, code: str, *, deadline: float, lost: str | None = None
    ) -> CellOutput:
        """Run ``code`` in the session of ``key`` (``None``: a throw-away interpreter).

        Args:
            key: the conversation's key, or ``None`` for no persistence.
            code: Python source.
            deadline: event-loop time at which the interpreter is killed.
            lost: why the conversation's earlier interpreter is not in this process
                (``ExtensionContext.session_lost``): told to the model when the call
                starts a new session here (a session this process holds is kept).

        Raises:
            InterpreterTimeout: ``deadline`` passed while the code ran.
            asyncio.CancelledError: the call was cancelled (the interpreter was killed
                if it was running this call's code).
        """
        if key is None:
            session = Session(self.config)
            try:
                return await session.run(code, deadline=deadline)
            finally:
                session.stop("single call")
        session = self._acquire(key, lost)
        try:
            async with session.lock:
                return await session.run(code, deadline=deadline)
        finally:
            self._release(key, session)

    def _acquire(self, key: str, lost: str | None = None) -> Session:
        session = self._sessions.get(key)
        if session is not None and session.loop is not asyncio.get_running_loop():
            self._drop(key, session, "the worker's event loop was replaced")
            session = None
        if session is None:
            session = Session(self.config, self._lost.pop(key, None) or lost)
            self._sessions[key] = session
        self._sessions.move_to_end(key)
        session.users += 1
        if session.idle_timer is not None:
            session.idle_timer.cancel()
            session.idle_timer = None
        self._shrink()
        return session

    def _release(self, key: str, session: Session) -> None:
        session.users -= 1
        if session.users:
            return  # another call of the conversation holds or waits for it
        if self._sessions.get(key) is not session:
            session.stop("it was dropped while in use")  # e.g. by close()
            return
        if session.interpreter is None:
            self._forget(key, session)
            return
        session.idle_timer = session.loop.call_later(
            self.config.idle_timeout_s, self._expire, key, session
        )
        self._shrink()

    def _expire(self, key: str, session: Session) -> None:
        session.idle_timer = None
        if self._sessions.get(key) is session and not session.users:
            self._drop(key, session, f"it was idle for more than {self.config.idle_timeout_s:g} s")

    def _shrink(self) -> None:
        """Stop least recently used idle sessions while there are too many."""
        excess = len(self._sessions) - self.config.max_sessions
        for key, session in list(self._sessions.items()):
            if excess <= 0:
                break
            if not session.users:
                self._drop(key, session, "this worker needed room for other conversations")
                excess -= 1

    def _drop(self, key: str, session: Session, reason: str) -> None:
        session.stop(reason)
        self._forget(key, session)

    def _forget(self, key: str, session: Session) -> None:
        """Remove an interpreter-less session, remembering why its interpreter went."""
        del self._sessions[key]
        if session.lost_reason:
            self._lost[key] = session.lost_reason
            self._lost.move_to_end(key)
            while len(self._lost) > MAX_REMEMBERED:
                self._lost.popitem(last=False)

    def close(self) -> None:
        """Stop every interpreter now (for shutdown and tests)."""
        for key, session in list(self._sessions.items()):
            self._drop(key, session, "the tool was closed")

    async def aclose(self) -> None:
        """Stop every interpreter and wait until they are reaped and their directories gone."""
        self.close()
        await wait_tidied()
