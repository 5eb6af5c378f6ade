"""What every ``toolfleet`` command shares: global options, Redis, one error boundary.

* :class:`ToolfleetGroup` gives every command (nested ones too) the global options
  ``--redis-url``, ``--namespace`` and ``--debug``, so they work before or after the
  subcommand (``toolfleet --redis-url U worker`` and ``toolfleet worker --redis-url U``).
* Its :meth:`~ToolfleetGroup.invoke` is the one place where a Redis failure
  (``redis.RedisError``, :class:`~toolfleet.shared.errors.ConnectionFailed`) or another
  :class:`~toolfleet.shared.errors.ToolfleetError` becomes at most three lines on stderr:
  what failed, the URL without its password, what to do; exit status 2. ``--debug``
  prints the traceback as well.
"""

from __future__ import annotations

import logging
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

import click
import redis
from rich.console import Console

from toolfleet.producer import ToolClient
from toolfleet.shared.connect import sync_client
from toolfleet.shared.errors import ConfigurationError, ConnectionFailed, ToolfleetError
from toolfleet.shared.settings import Settings
from toolfleet.shared.urls import check_redis_url, redacted_url

__all__ = ["EXIT_FAILED", "CliState", "Outage", "ToolfleetGroup", "connection_failed", "console"]

#: Exit status of a command that could not reach Redis or was misconfigured.
EXIT_FAILED = 2

#: Seconds a command waits for Redis to connect or answer (at least ``redis_timeout_s``).
CLI_TIMEOUT_S = 10.0

_WHERE = "pass --redis-url or set TOOLFLEET_REDIS_URL"

#: Where every command prints: text is text, never rich markup (a slug, a switch name, an
#: error message or a value read from Redis may hold ``[/red]``, which markup would swallow
#: or fail on); a command styles its own words with ``rich.text.Text`` instead.
console = Console(markup=False)


class CliState:
    """The context object of every command: settings (after every option) and ``--debug``."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.debug = False

    def require_url(self) -> str:
        """The configured Redis URL, checked for a scheme.

        Raises:
            click.UsageError: no URL is configured.
            ConfigurationError: not a URL redis-py can connect to (e.g. no scheme).
        """
        url = self.settings.redis_url
        if not url:
            raise click.UsageError(f"no Redis URL: {_WHERE}")
        return check_redis_url(url)

    def redis(self, **options: Any) -> redis.Redis:
        """A client for the configured URL that answered ``PING``.

        Args:
            options: keyword arguments for ``redis.Redis.from_url`` (e.g. ``socket_timeout``).

        Raises:
            click.UsageError, ConfigurationError: see :meth:`require_url`.
            ConnectionFailed: Redis did not answer.
        """
        url = self.require_url()
        # a person waits for an answer: a busy Redis gets longer than a producer would give it
        timeout_s = max(self.settings.redis_timeout_s, CLI_TIMEOUT_S)
        options.setdefault("socket_connect_timeout", timeout_s)
        options.setdefault("socket_timeout", timeout_s)
        client: redis.Redis = sync_client(url, **options)  # type: ignore[assignment]
        try:
            client.ping()
        except redis.RedisError as exc:
            client.close()
            raise connection_failed(exc, url) from exc
        return client

    def tool_client(self) -> ToolClient:
        """A producer client for the configured URL, after checking that Redis answers.

        The producer's own warnings (a reply listener reconnecting, calls it could not
        cancel) stay off the terminal unless ``--debug``: the command reports the outcome.

        Raises:
            click.UsageError, ConfigurationError, ConnectionFailed: see :meth:`redis`.
        """
        self.ping()
        if not self.debug:
            logging.getLogger("toolfleet.producer").setLevel(logging.CRITICAL)
        return ToolClient(self.require_url(), settings=self.settings)

    def ping(self) -> None:
        """Check that Redis answers (before building a producer client on it).

        Raises:
            click.UsageError, ConfigurationError, ConnectionFailed: see :meth:`redis`.
        """
        self.redis().close()


class Outage:
    """How a long-running command (``top``, ``events``) rides out a Redis blip.

    It reports the start of an outage once and its end once on stderr, and says how long
    to wait before the next attempt (backing off to ``max_delay_s``). redis-py reconnects
    by itself on the next command.

    Args:
        url: the Redis URL (shown redacted).
        max_delay_s: longest wait between attempts, seconds.
    """

    def __init__(self, url: str | None, max_delay_s: float = 2.0) -> None:
        self.url = redacted_url(url)
        self.max_delay_s = max_delay_s
        self.failures = 0

    def failed(self, exc: redis.RedisError) -> float:
        """Note a failed attempt; return the seconds to wait before the next one."""
        if self.failures == 0:
            click.echo(f"Redis at {self.url} unreachable ({exc}); retrying", err=True)
        self.failures += 1
        return min(self.max_delay_s, 0.1 * 2.0 ** min(self.failures, 5))

    def recovered(self) -> None:
        """Note a successful command (reports the end of an outage)."""
        if self.failures:
            click.echo(f"Redis at {self.url} is back", err=True)
        self.failures = 0


def connection_failed(exc: redis.RedisError, url: str) -> ConnectionFailed:
    """A :class:`ConnectionFailed` for ``exc``, saying what failed at ``url`` (redacted)."""
    shown = redacted_url(url)
    if isinstance(exc, redis.AuthenticationError):
        return ConnectionFailed(f"Redis at {shown} refused the credentials: {exc}", url=shown)
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
        return ConnectionFailed(f"cannot reach Redis at {shown}: {exc}", url=shown)
    return ConnectionFailed(f"Redis at {shown} failed a command: {exc}", url=shown)


def _hint(exc: BaseException) -> str:
    if isinstance(exc, ConnectionFailed):
        if "credentials" in str(exc):
            return "check the user and password in the URL"
        return "start Redis there, or point --redis-url (or TOOLFLEET_REDIS_URL) at a running one"
    if isinstance(exc, ConfigurationError):
        return "fix that and run the command again"
    return "see the message above"


def failure_lines(exc: BaseException, url: str | None) -> list[str] | None:
    """The lines (at most 3) that report ``exc``, or ``None`` when it is not ours to report."""
    if isinstance(exc, redis.RedisError):
        exc = connection_failed(exc, url or "")
    if not isinstance(exc, ToolfleetError):
        return None
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return [f"error: {first}", f"  {_hint(exc)} (--debug shows the traceback)"]


def _fail(ctx: click.Context, exc: BaseException, lines: list[str]) -> NoReturn:
    state = ctx.find_object(CliState)
    if state is not None and state.debug:
        traceback.print_exception(exc, file=sys.stderr)
    for line in lines:
        click.echo(line, err=True)
    ctx.exit(EXIT_FAILED)


def _setter(field: str) -> Callable[[click.Context, click.Parameter, Any], None]:
    def set_value(ctx: click.Context, param: click.Parameter, value: Any) -> None:
        if value is None or value is False:
            return
        state = ctx.ensure_object(CliState)
        if field == "debug":
            state.debug = True
        else:
            state.settings = state.settings.model_copy(update={field: value})

    return set_value


def global_options() -> list[click.Option]:
    """Fresh ``--redis-url``, ``--namespace`` and ``--debug`` options for one command."""
    return [
        click.Option(
            ["--redis-url"],
            expose_value=False,
            callback=_setter("redis_url"),
            help="Redis URL (redis://, rediss:// or unix://); env TOOLFLEET_REDIS_URL.",
        ),
        click.Option(
            ["--namespace"],
            expose_value=False,
            callback=_setter("namespace"),
            help="Prefix of every Redis key; env TOOLFLEET_NAMESPACE.",
        ),
        click.Option(
            ["--debug"],
            is_flag=True,
            default=False,
            expose_value=False,
            callback=_setter("debug"),
            help="Show the traceback of a failure.",
        ),
    ]


def _with_global_options(command: click.Command) -> None:
    names = {name for param in command.params for name in getattr(param, "opts", [])}
    if "--redis-url" not in names:
        command.params.extend(global_options())
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _with_global_options(sub)


class ToolfleetGroup(click.Group):
    """The root group: global options on every command, one error boundary for all."""

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Register ``cmd`` (and its subcommands) with the global options added."""
        _with_global_options(cmd)
        super().add_command(cmd, name)

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; report Redis and toolfleet errors in at most 3 lines.

        ``KeyboardInterrupt`` ends the command quietly with status 130.
        """
        try:
            return super().invoke(ctx)
        except (redis.RedisError, ToolfleetError) as exc:
            state = ctx.find_object(CliState)
            url = state.settings.redis_url if state is not None else None
            lines = failure_lines(exc, url)
            if lines is None:  # pragma: no cover - both kinds are always reported
                raise
            _fail(ctx, exc, lines)
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)
