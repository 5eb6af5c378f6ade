"""``toolfleet ui``: serve the ops page (:mod:`toolfleet.ui`) with uvicorn."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path
from typing import NoReturn

import click

from toolfleet.worker.cli.support import CliState

__all__ = ["ui"]

#: Host names that resolve to the loopback interface only.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address or name (``127.0.0.0/8``, ``::1``, localhost).

    ``0.0.0.0``, ``::`` and any other address or name are not: they reach other machines.
    """
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=8780, show_default=True, help="TCP port."
)
@click.option(
    "--tokens-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML [[tokens]] with sha256 and role (viewer | operator): log in with a token.",
)
@click.option(
    "--session-secret-file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Key that signs session cookies (default: random, so sessions end with the process).",
)
@click.option("--no-auth", is_flag=True, help="No login; allowed only on a loopback --host.")
@click.option("--read-only", is_flag=True, help="Offer and accept no change, whoever asks.")
@click.option(
    "--interval",
    "interval_s",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds between reads of the fleet while a page is open.",
)
@click.pass_obj
def ui(
    obj: CliState,
    host: str,
    port: int,
    tokens_file: Path | None,
    session_secret_file: Path | None,
    no_auth: bool,
    read_only: bool,
    interval_s: float,
) -> None:
    """Serve the ops page: queues, tools, workers, limits, failures and switches, live."""
    if no_auth and tokens_file is not None:
        raise click.UsageError("pass --tokens-file or --no-auth, not both")
    if tokens_file is None and not no_auth:
        _refuse("pass --tokens-file (or --no-auth on a loopback --host)")
    if no_auth and not is_loopback(host):
        _refuse(f"--no-auth on {host}, which is not a loopback address: pass --tokens-file")
    try:
        import uvicorn

        from toolfleet.ui import Sessions, UiConfig, create_app, load_tokens
        from toolfleet.ui.auth import TokensFileError
    except ImportError as exc:
        _refuse(f"the ops page needs the ui extra: pip install 'toolfleet[ui]' ({exc.name})")
    sessions = None
    if tokens_file is not None:
        try:
            tokens = load_tokens(tokens_file)
        except TokensFileError as exc:
            _refuse(str(exc))
        secret = session_secret_file.read_bytes().strip() if session_secret_file else None
        sessions = Sessions(tokens, secret=secret or None)
    obj.redis().close()  # Redis answers: fail here with one line, not on the first page
    settings = obj.settings
    config = UiConfig(
        redis_client=lambda: obj.redis(socket_timeout=5),
        namespace=settings.namespace,
        worker_ttl_s=settings.worker_ttl_s,
        interval_s=interval_s,
        sessions=sessions,
        read_only=read_only,
    )
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"toolfleet ui: http://{shown}:{port}/ (Ctrl-C to stop)", err=True)
    uvicorn.run(create_app(config), host=host, port=port, log_level="warning",
                proxy_headers=True, server_header=False)  # fmt: skip


def _refuse(why: str) -> NoReturn:
    click.echo(f"toolfleet ui: {why}", err=True)
    sys.exit(2)
