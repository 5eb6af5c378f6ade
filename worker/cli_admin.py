"""Admin commands of the CLI: ``switch`` and ``extensions check``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
import redis
from rich.console import Console
from rich.table import Table

from toolfleet.shared import codec
from toolfleet.shared.naming import (
    catalog_key,
    extension_errors_key,
    mcp_servers_key,
    switches_key,
)
from toolfleet.worker.loader import load_all
from toolfleet.worker.toolkit import Toolkit

__all__ = ["extensions", "switch"]

console = Console()


@click.group()
def switch() -> None:
    """Turn functions, extensions and extension switches on or off at run time."""


def _client(ctx: click.Context) -> redis.Redis:
    url: str = ctx.obj.require_url()
    return redis.Redis.from_url(url)


def _set(ctx: click.Context, name: str, state: str) -> None:
    client = _client(ctx)
    client.hset(switches_key(ctx.obj.settings.namespace), name, state)
    client.close()
    click.echo(f"{name}: {state}")


@switch.command(name="on")
@click.argument("name")
@click.pass_context
def switch_on(ctx: click.Context, name: str) -> None:
    """Turn switch NAME on (a function name, ext_<slug>, or ext_<slug>_<switch>)."""
    _set(ctx, name, "on")


@switch.command(name="off")
@click.argument("name")
@click.pass_context
def switch_off(ctx: click.Context, name: str) -> None:
    """Turn switch NAME off; workers pick it up within their heartbeat interval."""
    _set(ctx, name, "off")


@switch.command(name="list")
@click.pass_context
def switch_list(ctx: click.Context) -> None:
    """List declared switches and every switch set in Redis, with their states."""
    client = _client(ctx)
    namespace = ctx.obj.settings.namespace
    raw_states: dict[bytes, bytes] = client.hgetall(switches_key(namespace))  # type: ignore[assignment]
    states = {k.decode(): v.decode() for k, v in raw_states.items()}
    declared: dict[str, bool] = {}
    for data in client.hvals(catalog_key(namespace)):
        entry: dict[str, Any] = codec.loads(data)
        for item in entry.get("switches") or []:
            declared[item["name"]] = bool(item.get("default", True))
    client.close()
    table = Table("switch", "state", "source")
    for name in sorted(set(declared) | set(states)):
        if name in states:
            table.add_row(name, states[name], "set")
        else:
            table.add_row(name, "on" if declared[name] else "off", "default")
    console.print(table)


@click.group()
def extensions() -> None:
    """Inspect extensions."""


@extensions.command(name="check")
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--extension", "specs", multiple=True, metavar="MODULE:ATTR")
@click.option("--no-entry-points", is_flag=True, help="Skip installed extensions.")
@click.pass_context
def check(
    ctx: click.Context, paths: tuple[Path, ...], specs: tuple[str, ...], no_entry_points: bool
) -> None:
    """Load extensions (installed ones, folders PATHS, --extension) and print every problem.

    Exits 1 when any extension has a problem. With a Redis URL, problems the running
    workers reported are listed too.
    """
    settings = ctx.obj.settings
    folders = [*settings.extension_folders(), *paths]
    loaded, errors = load_all(list(specs), folders=folders, entry_points_too=not no_entry_points)
    toolkit = Toolkit(namespace=settings.namespace, secrets_dir=settings.secrets_dir)
    toolkit.errors.update(errors)
    try:
        toolkit.add_extensions(loaded)
    finally:
        toolkit.close()  # this check's own MCP servers (started to list their tools)
    fleet_mcp: dict[str, int] | None = None
    reported: dict[bytes, bytes] = {}
    if settings.redis_url:
        client = redis.Redis.from_url(settings.redis_url)
        reported = client.hgetall(extension_errors_key(settings.namespace))  # type: ignore[assignment]
        fleet_mcp = _fleet_mcp_processes(client, settings.namespace, settings.worker_ttl_s)
        client.close()
    table = Table("extension", "version", "functions", "queue", "MCP server")
    for slug, extension in sorted(toolkit.extensions.items()):
        count = sum(1 for s in toolkit.served.values() if s.extension is extension)
        table.add_row(
            slug, extension.version, str(count), extension.queue_name,
            _mcp_cell(extension.mcp.transport if extension.mcp else None, fleet_mcp, slug),
        )  # fmt: skip
    console.print(table)
    problems = dict(toolkit.errors)
    if reported:
        for raw_source, raw_message in reported.items():
            problems.setdefault(f"worker: {raw_source.decode()}", raw_message.decode())
    for source, message in sorted(problems.items()):
        console.print(f"[red]problem[/] {source}: {message}", highlight=False)
    if problems:
        console.print(f"{len(problems)} extension(s) with problems")
    sys.exit(1 if problems else 0)


def _fleet_mcp_processes(client: redis.Redis, namespace: str, ttl_s: float) -> dict[str, int]:
    """Slug -> MCP server processes the live workers report (one per worker process)."""
    counts: dict[str, int] = {}
    fresh_after = time.time() - ttl_s * 3
    for raw in client.hvals(mcp_servers_key(namespace)):
        report: dict[str, Any] = codec.loads(raw)
        if float(report.get("at", 0)) < fresh_after:
            continue
        for slug, state in (report.get("servers") or {}).items():
            counts[slug] = counts.get(slug, 0) + int(state.get("processes", 0))
    return counts


def _mcp_cell(transport: str | None, fleet: dict[str, int] | None, slug: str) -> str:
    if transport is None:
        return ""
    if transport == "http":
        return "http (remote)"
    where = f"{fleet.get(slug, 0)} running in the fleet" if fleet is not None else "fleet: no Redis"
    return f"stdio, 1 per worker process; {where}"
