"""The ``[mcp]`` table of an extension manifest: an MCP server whose tools the extension serves.

stdio (the worker starts the server as its child process)::

    [mcp]
    command = "mcp-server-time"            # a path (relative to the extension's folder) or a name
    args = ["--local-timezone", "{settings.zone}"]
    env = { API_TOKEN = "{settings.token}" }
    cwd = "."                              # relative to the extension's folder (the default)
    start_timeout = 10.0                   # seconds for start + initialize + tools/list

Streamable HTTP (the server runs elsewhere)::

    [mcp]
    url = "https://tools.example.com/mcp"
    headers = { Authorization = "Bearer {settings.api_key}" }

``{settings.<name>}`` in ``args``, ``env``, ``cwd``, ``url`` and ``headers`` is replaced by
the extension's setting of that name (``{{`` and ``}}`` are literal braces). A secret
setting may not appear in ``args`` (:func:`secret_args_problem`): a process's arguments are
readable by every user of the machine; pass it in ``env``. Nothing else is expanded: no
``$VAR``, no ``~``; the worker's own environment never reaches the server except through
declared settings.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["McpServerConfig", "expand_settings", "secret_args_problem", "setting_references"]

#: ``{settings.<name>}``; ``{{`` / ``}}`` escape a literal brace.
_PLACEHOLDER = re.compile(r"\{\{|\}\}|\{settings\.([A-Za-z_][A-Za-z0-9_]*)\}")


class McpServerConfig(BaseModel):
    """How to reach one MCP server: stdio (``command``) or Streamable HTTP (``url``).

    Attributes:
        command: executable of a stdio server. A value with a ``/`` is a path (relative
            to the extension's folder); a bare name is looked up in the worker's ``PATH``,
            then beside the worker's Python (its virtualenv's ``bin``).
        args: its command-line arguments.
        env: environment variables of the server process, on top of a minimal base
            (``PATH``, ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``TERM``, the MCP SDK's
            default); nothing else of the worker's environment.
        cwd: working directory, relative to the extension's folder; default the folder.
        url: endpoint of a Streamable HTTP server.
        headers: HTTP headers sent with every request (e.g. ``Authorization``).
        start_timeout: seconds allowed for starting the server, ``initialize`` and the
            whole ``tools/list``; a server that takes longer is reported broken.
        trust_idempotent_hint: serve tools whose ``idempotentHint`` is true as idempotent
            (re-run after a worker died, retried when the manifest says so). Off by
            default: annotations are hints from the server, so the manifest must agree.
    """

    model_config = ConfigDict(extra="forbid")

    command: str | None = None
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    start_timeout: float = Field(default=10.0, gt=0, le=300)
    trust_idempotent_hint: bool = False

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (Streamable HTTP), not both")
        if self.url is not None and (self.args or self.env or self.cwd):
            raise ValueError("args, env and cwd belong to a stdio server (command)")
        if self.command is not None and self.headers:
            raise ValueError("headers belong to a Streamable HTTP server (url)")
        if self.url is not None and not re.match(r"^https?://", self.url):
            raise ValueError(f"url {self.url!r} must start with http:// or https://")
        return self

    @property
    def transport(self) -> str:
        """``stdio`` or ``http``."""
        return "stdio" if self.command is not None else "http"

    def template_values(self) -> list[str]:
        """Every value that may hold ``{settings.<name>}`` placeholders."""
        values = [*self.args, *self.env.values(), *self.headers.values()]
        values += [v for v in (self.cwd, self.url) if v is not None]
        return values


def setting_references(text: str) -> set[str]:
    """The setting names ``text`` refers to with ``{settings.<name>}``."""
    return {m.group(1) for m in _PLACEHOLDER.finditer(text) if m.group(1)}


def secret_args_problem(config: McpServerConfig, secret_names: Collection[str]) -> str | None:
    """Why ``config`` may not start: its ``args`` name secret settings; ``None`` when they do not.

    A stdio server's arguments are its ``/proc/<pid>/cmdline``, which every user of the
    machine can read (and which is written again at each restart of the server); its
    environment (``/proc/<pid>/environ``) is readable only by its own user. So a secret
    goes in ``env``, and the manifest check and the worker both refuse it in ``args``.

    Args:
        config: the ``[mcp]`` table.
        secret_names: the extension's settings declared ``secret = true``.
    """
    named = sorted({name for arg in config.args for name in setting_references(arg)})
    secret = [name for name in named if name in secret_names]
    if not secret:
        return None
    example = ", ".join(f'{name.upper()} = "{{settings.{name}}}"' for name in secret)
    return (
        f"args name the secret settings {secret}: a process's arguments are readable by "
        f"every user of the machine (/proc/<pid>/cmdline); pass secrets to the server in env "
        f"instead, e.g. env = {{ {example} }}"
    )


def expand_settings(text: str, values: Mapping[str, Any]) -> str:
    """Replace each ``{settings.<name>}`` in ``text`` by ``str(values[name])``.

    Args:
        text: a manifest value.
        values: setting name -> plain value (secrets already unwrapped).

    Raises:
        KeyError: ``text`` names a setting absent from ``values`` (the name is the
            exception's argument; the manifest check reports it before this runs).
    """

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "{{":
            return "{"
        if token == "}}":
            return "}"
        value = values[match.group(1)]
        return "" if value is None else str(value)

    return _PLACEHOLDER.sub(replace, text)
