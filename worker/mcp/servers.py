"""The MCP servers of one worker process: their loop thread, their sessions, their targets.

One :class:`McpServers` per :class:`~toolfleet.worker.registry.registry.Registry`. Its sessions run
on one daemon thread with its own asyncio loop (so an ``async`` tool that blocks the
tools' loop cannot stall them, and the thread that spawns the stdio servers lives as
long as the process: their parent-death signal is tied to it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import sys
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import mcp_types as types
from pydantic import BaseModel, SecretStr

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.extension import Extension
from toolfleet.shared.mcp_config import McpServerConfig, expand_settings, secret_args_problem
from toolfleet.shared.spec import ToolSpec
from toolfleet.worker.mcp import launch
from toolfleet.worker.mcp.connection import HttpTarget, McpConnection, StdioTarget, Target
from toolfleet.worker.mcp.tools import result_value, tool_specs
from toolfleet.worker.supervision import metrics

__all__ = ["BASE_ENV", "McpServers", "resolve_command", "target_for"]

#: The only variables of the worker's environment a stdio server gets (beside its
#: manifest's ``env``): the MCP SDK's default inheritance list on POSIX.
BASE_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER")

#: Seconds past ``start_timeout`` a start may take (the SDK's bounded stdio shutdown).
START_MARGIN_S = 10.0

#: ``on_change(slug, specs, problems)``: an extension's tool list changed.
OnSpecs = Callable[[str, list[ToolSpec], list[str]], None]


class McpServers:
    """Starts, serves and closes the MCP servers of this process's MCP extensions.

    Args:
        on_change: ``on_change(slug, specs, problems)``, called on the MCP thread when a
            started extension's tool list changes.
    """

    def __init__(self, on_change: OnSpecs) -> None:
        self.on_change = on_change
        self.connections: dict[str, McpConnection] = {}
        self._pending: dict[str, tuple[McpConnection, concurrent.futures.Future[Any]]] = {}
        self._started: set[str] = set()
        self._restarts_seen: dict[str, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    def begin(self, extension: Extension, settings: BaseModel | None) -> None:
        """Start ``extension``'s server without waiting (:meth:`start` collects it).

        Raises:
            ConfigurationError: the command cannot be found.
        """
        config = extension.mcp
        assert config is not None
        slug = extension.slug
        if slug in self._pending or slug in self.connections:
            return
        target = target_for(config, settings, extension.folder)

        def on_tools(tools: list[types.Tool]) -> None:
            if slug in self._started:  # later lists: list_changed, or a restarted server
                self.on_change(slug, *self._specs(extension, connection, tools))

        connection = McpConnection(slug, target, config.start_timeout, on_tools)
        self._pending[slug] = (connection, self._submit(connection.start()))

    def start(
        self, extension: Extension, settings: BaseModel | None
    ) -> tuple[list[ToolSpec], list[str]]:
        """Start (or collect the start of) ``extension``'s server; its tools as specs.

        Blocks for at most the manifest's ``start_timeout`` plus :data:`START_MARGIN_S`.
        Afterwards ``on_change(slug, specs, problems)`` is called (on the MCP thread)
        whenever the server's tool list changes.

        Returns:
            ``(specs, problems)``: problems name tools that could not be served.

        Raises:
            ConfigurationError: the server could not be started, initialized or listed.
        """
        config = extension.mcp
        assert config is not None
        slug = extension.slug
        self.begin(extension, settings)
        connection, future = self._pending.pop(slug)
        try:
            tools = future.result(config.start_timeout + START_MARGIN_S)
        except Exception as exc:  # noqa: BLE001 - reported as a broken extension
            self._submit(connection.close())
            why = "no answer in time" if isinstance(exc, TimeoutError) else str(exc)
            raise ConfigurationError(f"extension {slug!r}: MCP server not started: {why}") from None
        self._started.add(slug)
        self.connections[slug] = connection
        metrics.MCP_SERVERS.labels(slug).set(1 if connection.transport == "stdio" else 0)
        return self._specs(extension, connection, tools)

    def _specs(
        self, extension: Extension, connection: McpConnection, tools: list[types.Tool]
    ) -> tuple[list[ToolSpec], list[str]]:
        loop = self._event_loop()

        async def call(name: str, arguments: dict[str, Any], context: Any) -> Any:
            progress = getattr(context, "progress_sink", None)
            running = asyncio.run_coroutine_threadsafe(
                connection.call(name, arguments, progress), loop
            )
            # cancelling this coroutine (time limit, client.cancel) cancels the call on
            # the MCP loop, and the SDK sends notifications/cancelled for it
            return result_value(await asyncio.wrap_future(running))

        assert extension.mcp is not None
        return tool_specs(
            extension.slug, tools, call, trust_idempotent_hint=extension.mcp.trust_idempotent_hint
        )

    def stop(self, slug: str) -> None:
        """Close one extension's session (when it could not be added after all); never raises."""
        self._started.discard(slug)
        connection = self.connections.pop(slug, None)
        if connection is not None:
            concurrent.futures.wait([self._submit(connection.close())], timeout=15)
            metrics.MCP_SERVERS.labels(slug).set(0)

    def status(self) -> dict[str, dict[str, Any]]:
        """Per slug: state, transport, live server processes, restarts, tools, last error."""
        found = {}
        for slug, connection in list(self.connections.items()):
            found[slug] = connection.status()
            metrics.MCP_SERVERS.labels(slug).set(found[slug]["processes"])
            new = connection.restarts - self._restarts_seen.get(slug, 0)
            if new > 0:
                metrics.MCP_SERVER_RESTARTS.labels(slug).inc(new)
                self._restarts_seen[slug] = connection.restarts
        return found

    def close(self, timeout_s: float = 15.0) -> None:
        """Close every session at once; wait at most ``timeout_s`` seconds in all.

        A stdio server gets its stdin closed, then the SDK's SIGTERM/SIGKILL escalation.
        """
        closing = []
        for slug in list(self.connections):
            self._started.discard(slug)
            closing.append(self._submit(self.connections.pop(slug).close()))
            metrics.MCP_SERVERS.labels(slug).set(0)
        concurrent.futures.wait(closing, timeout=timeout_s)
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)

    def _submit(self, coro: Coroutine[Any, Any, Any]) -> concurrent.futures.Future[Any]:
        return asyncio.run_coroutine_threadsafe(coro, self._event_loop())

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="toolfleet-mcp", daemon=True).start()
                self._loop = loop
            return self._loop


def target_for(config: McpServerConfig, settings: BaseModel | None, folder: Path | None) -> Target:
    """Where ``config``'s server is, with ``{settings.<name>}`` filled in.

    A stdio server gets :data:`BASE_ENV` from the worker and the manifest's ``env``;
    it is started through :mod:`toolfleet.worker.mcp.launch` (dies with its worker).

    Raises:
        ConfigurationError: the command cannot be found, or ``args`` name a secret
            setting (:func:`~toolfleet.shared.mcp_config.secret_args_problem`; an extension
            built in Python skips the manifest check).
    """
    values = _plain_values(settings)
    problem = secret_args_problem(config, _secret_names(settings))
    if problem:
        raise ConfigurationError(f"MCP server not started: {problem}")

    def fill(text: str) -> str:
        return expand_settings(text, values)

    if config.url is not None:
        return HttpTarget(fill(config.url), {k: fill(v) for k, v in config.headers.items()})
    assert config.command is not None
    base = folder or Path.cwd()
    cwd = base / fill(config.cwd) if config.cwd else base
    executable = resolve_command(config.command, base)
    env = {k: os.environ[k] for k in BASE_ENV if k in os.environ}
    env.update({k: fill(v) for k, v in config.env.items()})
    argv = [
        sys.executable, "-I", launch.__file__, str(os.getpid()), executable,
        *(fill(a) for a in config.args),
    ]  # fmt: skip
    return StdioTarget(argv=argv, env=env, cwd=str(cwd))


def resolve_command(command: str, folder: Path) -> str:
    """The absolute path of ``command`` (rules in :class:`McpServerConfig`).

    Raises:
        ConfigurationError: not found, or not executable.
    """
    if "/" in command:
        path = Path(os.path.normpath(folder / command))  # no resolve(): keep venv symlinks
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
        raise ConfigurationError(f"MCP server command not found or not executable: {path}")
    found = shutil.which(command) or shutil.which(command, path=str(Path(sys.executable).parent))
    if found is None:
        raise ConfigurationError(
            f"MCP server command not found: {command!r} (looked in PATH and "
            f"{Path(sys.executable).parent})"
        )
    return str(Path(found).absolute())


def _plain_values(settings: BaseModel | None) -> dict[str, Any]:
    if settings is None:
        return {}
    values = {}
    for name in type(settings).model_fields:
        value = getattr(settings, name)
        values[name] = value.get_secret_value() if isinstance(value, SecretStr) else value
    return values


def _secret_names(settings: BaseModel | None) -> set[str]:
    if settings is None:
        return set()
    return {n for n in type(settings).model_fields if isinstance(getattr(settings, n), SecretStr)}
