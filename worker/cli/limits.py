"""``toolfleet limits``: per-account quotas, set at run time (like ``toolfleet switch``)."""

from __future__ import annotations

import click
import redis
from pydantic import ValidationError
from rich.table import Table

from toolfleet.shared.group_copies import fleet_copy, hdel_everywhere, hset_everywhere
from toolfleet.shared.tenancy.quotas import DEFAULT_SCOPE, Quota, limits_key
from toolfleet.worker.cli.support import console

__all__ = ["limits"]


@click.group()
def limits() -> None:
    """Per-account quotas: calls in flight and calls per second.

    SCOPE is an account, ``ACCOUNT/FUNCTION`` (that account's calls of one function) or
    ``*`` (every account without a quota of its own; else the producers'
    TOOLFLEET_QUOTA_* settings apply). A change applies to the next call fleet-wide: the
    producer checks the quota in Redis when it publishes.
    """


@limits.command(name="set")
@click.argument("scope")
@click.option("--in-flight", type=int, default=None, help="Most calls in flight at once.")
@click.option("--per-s", type=float, default=None, help="Calls per second, sustained.")
@click.option("--burst", type=int, default=None, help="Calls at once above the rate.")
@click.pass_context
def limits_set(
    ctx: click.Context,
    scope: str,
    in_flight: int | None,
    per_s: float | None,
    burst: int | None,
) -> None:
    """Set the quota of SCOPE (the options given replace the whole quota)."""
    try:
        quota = Quota(in_flight=in_flight, per_s=per_s, burst=burst)
    except ValidationError as exc:
        raise click.BadParameter(_problems(exc)) from None
    if quota == Quota():
        raise click.UsageError("give at least one of --in-flight, --per-s, --burst")
    client: redis.Redis = ctx.obj.redis()
    try:
        hset_everywhere(client, limits_key, ctx.obj.settings.namespace, scope,
                        quota.model_dump_json(exclude_none=True))  # fmt: skip
    finally:
        client.close()
    click.echo(f"{scope}: {_describe(quota)}")


@limits.command(name="delete")
@click.argument("scope")
@click.pass_context
def limits_delete(ctx: click.Context, scope: str) -> None:
    """Remove the quota of SCOPE (it falls back to ``*``, then the settings)."""
    client: redis.Redis = ctx.obj.redis()
    try:
        if not hdel_everywhere(client, limits_key, ctx.obj.settings.namespace, scope):
            raise click.ClickException(
                f"no quota is set for {scope!r} (see `toolfleet limits list`)"
            )
    finally:
        client.close()
    click.echo(f"{scope}: deleted")


@limits.command(name="list")
@click.pass_context
def limits_list(ctx: click.Context) -> None:
    """List the quotas set in Redis and the settings' default."""
    settings = ctx.obj.settings
    client: redis.Redis = ctx.obj.redis()
    try:
        raw: dict[bytes, bytes] = client.hgetall(limits_key(fleet_copy(client, settings.namespace)))  # type: ignore[assignment]
    finally:
        client.close()
    table = Table("scope", "in flight", "per s", "burst", "source")
    for scope, data in sorted((k.decode(), v) for k, v in raw.items()):
        try:
            quota = Quota.model_validate_json(data)
        except ValidationError:
            table.add_row(scope, "?", "?", "?", "unreadable")
            continue
        table.add_row(scope, *_cells(quota), "set")
    if DEFAULT_SCOPE.encode() not in raw:
        defaults = Quota(
            in_flight=settings.quota_in_flight,
            per_s=settings.quota_per_s,
            burst=settings.quota_burst,
        )
        table.add_row(DEFAULT_SCOPE, *_cells(defaults), "settings")
    console.print(table)


def _cells(quota: Quota) -> list[str]:
    return ["-" if v is None else f"{v:g}" for v in (quota.in_flight, quota.per_s, quota.burst)]


def _describe(quota: Quota) -> str:
    parts = quota.model_dump(exclude_none=True)
    return ", ".join(f"{name}={value:g}" for name, value in parts.items())


def _problems(exc: ValidationError) -> str:
    """Each refused option and why, e.g. ``--in-flight: Input should be greater than ...``."""
    return "; ".join(
        f"--{'.'.join(map(str, error['loc'])).replace('_', '-')}: {error['msg']}"
        for error in exc.errors()
    )
