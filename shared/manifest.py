"""Extension manifests: ``extension.toml``, or ``[tool.toolfleet]`` in a pyproject.toml.

``[tool.smarter]`` (the table Smarter-style extensions declare themselves in) is read as
an alias of ``[tool.toolfleet]``, with the same keys; a pyproject with both tables is
refused (which one is meant?).

Example ``extension.toml``::

    slug = "date-calculator"
    version = "1.2.0"
    description = "Date arithmetic with time zones."
    entry = "date_calculator:tools"     # MODULE:ATTR inside the extension's folder
    timeout = 5.0                       # seconds; a tool may set its own
    queue = "tools.dates"               # default: tools.<slug>
    isolation = "thread"                # thread | process
    enabled = true

    [tools.lookup]                      # per-tool overrides
    timeout = 10.0
    idempotent = true                   # may be re-run after a worker died, or retried
    retry = { attempts = 3, backoff_s = 0.2, on = ["crashed", "timeout"] }
    concurrency = 3                     # at most 3 calls at once, fleet-wide
    breaker = { failures = 5, cooldown_s = 30 }   # see toolfleet.shared.tenancy.breakers
    result_shaping = "truncate"         # a result over budget is cut to fit (default: error)

    [[settings]]
    name = "api_key"
    type = "str"
    secret = true
    env = "DATES_API_KEY"               # default: TOOLFLEET_EXT_<SLUG>_<NAME>

    [[switches]]
    name = "logging"
    default = false

    [availability]
    accounts_allowed = ["acme"]         # omit for every account
    accounts_denied = []

Instead of ``entry``, an ``[mcp]`` table declares an MCP server whose tools the extension
serves (see :mod:`toolfleet.shared.mcp_config`).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.mcp_config import (
    McpServerConfig,
    secret_args_problem,
    setting_references,
)
from toolfleet.shared.tenancy.breakers import BreakerPolicy

__all__ = [
    "Availability",
    "Manifest",
    "RetryPolicy",
    "SettingSpec",
    "SwitchSpec",
    "ToolOptions",
    "find_manifest",
    "read_manifest",
]

_SLUG = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,39}$")
_IDENT = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,63}$")

#: Setting types a manifest may declare, and the Python type each becomes.
SETTING_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool}


class SettingSpec(BaseModel):
    """One setting of an extension.

    Attributes:
        name: Python identifier; the field name on ``context.settings``.
        type: ``str``, ``int``, ``float`` or ``bool``.
        default: value when nothing is configured; a setting without one is required.
        secret: a secret is a ``pydantic.SecretStr`` and never leaves the worker
            (never in a message, reply, log record, event or the catalog).
        env: environment variable to read; default ``TOOLFLEET_EXT_<SLUG>_<NAME>``.
        description: what it is for.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    type: Literal["str", "int", "float", "bool"] = "str"
    default: Any = None
    secret: bool = False
    env: str | None = None
    description: str = ""

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _IDENT.match(value):
            raise ValueError(f"setting name {value!r} is not a Python identifier")
        return value


class SwitchSpec(BaseModel):
    """A run-time on/off switch, stored in Redis as ``ext_<slug>_<name>``.

    Attributes:
        name: short name (``logging``), or a tool's name to switch that tool.
        default: state when Redis holds none.
        description: what it does.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    default: bool = True
    description: str = ""


class Availability(BaseModel):
    """Which accounts may use an extension.

    Attributes:
        accounts_allowed: ``None`` for every account, else only these.
        accounts_denied: never these (wins over allowed).
    """

    model_config = ConfigDict(extra="forbid")

    accounts_allowed: list[str] | None = None
    accounts_denied: list[str] = Field(default_factory=list)

    def allows(self, account: str | None) -> bool:
        """True when ``account`` may call the extension's tools.

        ``None`` (no account given) is allowed only when there is no allow-list.
        """
        if account is not None and account in self.accounts_denied:
            return False
        if self.accounts_allowed is None:
            return True
        return account is not None and account in self.accounts_allowed


class RetryPolicy(BaseModel):
    """Retries of an idempotent tool (off unless declared; only within the call's deadline).

    Attributes:
        attempts: tries in all, the first included.
        backoff_s: seconds before the second try; doubles for each further one.
        on: which outcomes are retried: ``crashed`` (an unexpected exception) and/or
            ``timeout`` (the per-try limit passed).
    """

    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(default=3, ge=1, le=10)
    backoff_s: float = Field(default=0.1, ge=0)
    on: list[Literal["crashed", "timeout"]] = Field(default_factory=lambda: ["crashed"])  # type: ignore[arg-type]


class ToolOptions(BaseModel):
    """Per-tool overrides in a manifest's ``[tools.<name>]`` table.

    Attributes:
        timeout: the tool's time limit, seconds.
        idempotent: running it twice has no other effect than running it once; only an
            idempotent tool is re-run after its worker died or retried.
        isolation: ``thread`` or ``process``.
        retry: see :class:`RetryPolicy`.
        concurrency: most calls of the tool running at once across the fleet (an external
            API's limit); further calls wait for a slot within their deadline.
        breaker: its circuit breaker (see
            :class:`~toolfleet.shared.tenancy.breakers.BreakerPolicy`); none by default.
        result_shaping: what a result over its byte budget becomes: ``error`` (a
            ``tool_error`` telling the model to ask for less; the default) or ``truncate``
            (the result cut to fit, markers saying what was cut, ``shaped`` set; see
            :mod:`toolfleet.shared.shaping`).
    """

    model_config = ConfigDict(extra="forbid")

    timeout: float | None = Field(default=None, gt=0)
    idempotent: bool | None = None
    isolation: Literal["thread", "process"] | None = None
    retry: RetryPolicy | None = None
    concurrency: int | None = Field(default=None, ge=1)
    breaker: BreakerPolicy | None = None
    result_shaping: Literal["error", "truncate"] | None = None


class Manifest(BaseModel):
    """An extension's manifest (see the module docstring for the file format).

    Attributes:
        slug, version, description: identity.
        entry: ``MODULE:ATTR`` of the tools inside the extension's folder.
        timeout: default time limit of its tools, seconds.
        queue: the queue its calls go to; ``None`` for ``tools.<slug>``.
        isolation: ``thread`` or ``process``.
        settings, switches, availability, enabled: see their classes.
        tools: per-tool overrides by tool name (see :class:`ToolOptions`).
        event_payloads: put arguments and results in lifecycle events (default: redacted).
        mcp: an MCP server whose tools the extension serves, instead of ``entry``.
    """

    model_config = ConfigDict(extra="forbid")

    slug: str
    version: str
    description: str = ""
    entry: str | None = None
    timeout: float = Field(default=30.0, gt=0)
    queue: str | None = None
    isolation: Literal["thread", "process"] = "thread"
    settings: list[SettingSpec] = Field(default_factory=list)
    switches: list[SwitchSpec] = Field(default_factory=list)
    availability: Availability = Field(default_factory=Availability)
    enabled: bool = True
    tools: dict[str, ToolOptions] = Field(default_factory=dict)
    event_payloads: bool = False
    mcp: McpServerConfig | None = None

    @field_validator("slug")
    @classmethod
    def _slug(cls, value: str) -> str:
        if not _SLUG.match(value):
            raise ValueError(f"slug {value!r} must match {_SLUG.pattern}")
        return value

    @model_validator(mode="after")
    def _mcp_rules(self) -> Manifest:
        if self.mcp is None:
            return self
        if self.entry is not None:
            raise ValueError("give entry (Python tools) or [mcp] (an MCP server), not both")
        isolations = [self.isolation, *(o.isolation for o in self.tools.values())]
        if "process" in isolations:
            raise ValueError("isolation = 'process' does not apply to an MCP server's tools")
        declared = {s.name for s in self.settings}
        for value in self.mcp.template_values():
            unknown = setting_references(value) - declared
            if unknown:
                raise ValueError(f"mcp: {value!r} names undeclared settings {sorted(unknown)}")
        problem = secret_args_problem(self.mcp, {s.name for s in self.settings if s.secret})
        if problem:
            raise ValueError(f"mcp: {problem}")
        return self


#: The pyproject tables a manifest may live in: ours, and Smarter's as an alias.
PYPROJECT_TABLES = ("toolfleet", "smarter")


def find_manifest(folder: Path) -> Path | None:
    """The manifest file of ``folder``.

    ``extension.toml``, else a ``pyproject.toml`` with a ``[tool.toolfleet]`` (or
    ``[tool.smarter]``) table, else ``None``.
    """
    candidate = folder / "extension.toml"
    if candidate.is_file():
        return candidate
    pyproject = folder / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError:
            return pyproject  # let read_manifest report it
        if any(table in data.get("tool", {}) for table in PYPROJECT_TABLES):
            return pyproject
    return None


def read_manifest(path: Path) -> Manifest:
    """Read and validate a manifest file.

    Raises:
        ConfigurationError: unreadable TOML or invalid content; the message names the
            file and every problem.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"{path}: {exc}") from None
    if path.name == "pyproject.toml":
        tables = [t for t in PYPROJECT_TABLES if t in data.get("tool", {})]
        if len(tables) > 1:
            raise ConfigurationError(
                f"{path}: both [tool.toolfleet] and [tool.smarter] are present; keep one "
                "([tool.smarter] is read as an alias of [tool.toolfleet])"
            )
        table = tables[0] if tables else "toolfleet"
        data = data.get("tool", {}).get(table, {})
        if not isinstance(data, dict):
            raise ConfigurationError(f"{path}: [tool.{table}] must be a table")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'manifest'}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigurationError(f"{path}: invalid manifest: {problems}") from None
