"""Admin commands of the CLI: ``switch`` and ``extensions check``."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
import redis
from rich.table import Table
from rich.text import Text

from toolfleet.shared import codec
from toolfleet.shared.extension_errors import current_errors
from toolfleet.shared.group_copies import fleet_copy, hdel_everywhere, hset_everywhere
from toolfleet.shared.naming import (
    catalog_key,
    extension_errors_key,
    extension_switch,
    mcp_servers_key,
    switches_key,
)
from toolfleet.shared.nearest import nearest_names
from toolfleet.worker.cli.support import console
from toolfleet.worker.registry.loader import load_all
from toolfleet.worker.registry.registry import Registry

__all__ = ["extensions", "switch"]


@click.group()
def switch() -> None:
    """Turn functions, extensions and extension switches on or off at run time.

    A change applies to the next call fleet-wide: workers read the switch states with
    each call's claim, and a producer re-reads them before refusing a switched-off call.
    """


def _catalog_switches(client: redis.Redis, namespace: str) -> tuple[set[str], dict[str, bool]]:
    """What the catalog knows: every switchable name, and the declared switches' defaults.

    Switchable names are function names, ``ext_<slug>`` and declared extension switches.
    """
    names: set[str] = set()
    declared: dict[str, bool] = {}
    for data in client.hvals(catalog_key(fleet_copy(client, namespace))):
        try:
            entry: dict[str, Any] = codec.loads(data)
        except codec.DecodeError:
            continue
        if not isinstance(entry, dict):
            continue
        names |= {str(entry.get("name")), extension_switch(str(entry.get("slug", "")))}
        for item in entry.get("switches") or []:
            declared[str(item["name"])] = bool(item.get("default", True))
    return names | set(declared), declared


def _unknown(name: str, known: list[str], what: str) -> click.ClickException:
    nearest = nearest_names(name, known)
    if nearest:
        return click.ClickException(f"{what} {name!r}; nearest: {', '.join(nearest)}")
    return click.ClickException(f"{what} {name!r} (see `toolfleet tools --all`)")


def _set(ctx: click.Context, name: str, state: str, force: bool) -> None:
    client: redis.Redis = ctx.obj.redis()
    namespace = ctx.obj.settings.namespace
    try:
        if not force:
            known = sorted(_catalog_switches(client, namespace)[0])
            if not known:
                raise click.ClickException(
                    "the catalog is empty: start a worker first, or pass --force to set "
                    f"{name!r} anyway"
                )
            if name not in known:
                raise _unknown(name, known, "no function, extension or switch named")
        hset_everywhere(client, switches_key, namespace, name, state)
    finally:
        client.close()
    click.echo(f"{name}: {state}")


_FORCE = click.option(
    "--force", is_flag=True, help="Set NAME even if no catalogued worker knows it (yet)."
)


@switch.command(name="on")
@click.argument("name")
@_FORCE
@click.pass_context
def switch_on(ctx: click.Context, name: str, force: bool) -> None:
    """Turn switch NAME on (a function name, ext_<slug>, or ext_<slug>_<switch>)."""
    _set(ctx, name, "on", force)


@switch.command(name="off")
@click.argument("name")
@_FORCE
@click.pass_context
def switch_off(ctx: click.Context, name: str, force: bool) -> None:
    """Turn switch NAME off; the next call anywhere in the fleet sees it."""
    _set(ctx, name, "off", force)


@switch.command(name="delete")
@click.argument("name")
@click.pass_context
def switch_delete(ctx: click.Context, name: str) -> None:
    """Remove switch NAME from Redis: it falls back to its declared default (else on)."""
    client: redis.Redis = ctx.obj.redis()
    namespace = ctx.obj.settings.namespace
    key = switches_key(fleet_copy(client, namespace))
    try:
        if not hdel_everywhere(client, switches_key, namespace, name):
            raw: list[bytes] = client.hkeys(key)  # type: ignore[assignment]
            raise _unknown(name, sorted(k.decode() for k in raw), "no switch is set named")
    finally:
        client.close()
    click.echo(f"{name}: deleted")


@switch.command(name="list")
@click.pass_context
def switch_list(ctx: click.Context) -> None:
    """List declared switches and every switch set in Redis, with their states."""
    client: redis.Redis = ctx.obj.redis()
    namespace = ctx.obj.settings.namespace
    try:
        raw_states: dict[bytes, bytes] = client.hgetall(switches_key(fleet_copy(client, namespace)))  # type: ignore[assignment]
        declared = _catalog_switches(client, namespace)[1]
    finally:
        client.close()
    states = {k.decode(): v.decode() for k, v in raw_states.items()}
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
    client: redis.Redis | None = ctx.obj.redis() if settings.redis_url else None  # fail first
    folders = [*settings.extension_folders(), *paths]
    loaded, errors = load_all(list(specs), folders=folders, entry_points_too=not no_entry_points)
    registry = Registry(settings.namespace, secrets_dir=settings.secrets_dir)
    registry.errors.update(errors)
    try:
        registry.add_extensions(loaded)
    finally:
        registry.close()  # this check's own MCP servers (started to list their tools)
    fleet_mcp: dict[str, int] | None = None
    reported: dict[bytes, bytes] = {}
    if client is not None:
        fleet = fleet_copy(client, settings.namespace)  # the fleet's slot on a cluster
        reported = client.hgetall(extension_errors_key(fleet))  # type: ignore[assignment]
        fleet_mcp = _fleet_mcp_processes(client, fleet, settings.worker_ttl_s)
        client.close()
    # what is printed is text, never rich markup (a slug or an error may hold "[/red]"),
    # and holds no secret of an extension loaded here (its settings were read for the check)
    shown = registry.redactor.scrub
    table = Table("extension", "version", "functions", "queue", "MCP server")
    for slug, extension in sorted(registry.extensions.items()):
        count = sum(1 for s in registry.served.values() if s.extension is extension)
        cells = (
            slug, extension.version, str(count), extension.queue_name,
            _mcp_cell(extension.mcp.transport if extension.mcp else None, fleet_mcp, slug),
        )  # fmt: skip
        table.add_row(*(shown(cell) for cell in cells))
    console.print(table)
    problems = dict(registry.errors)
    if reported:
        for source, message in current_errors(reported, settings.worker_ttl_s).items():
            problems.setdefault(f"worker: {source}", message)
    for source, message in sorted(problems.items()):
        console.print(Text.assemble(("problem", "red"), " ", shown(f"{source}: {message}")))
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
