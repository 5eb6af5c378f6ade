"""``toolfleet quality``: which model fails which tool, from the per-minute aggregates."""

from __future__ import annotations

import csv
import io
import time

import click
import redis
from rich.table import Column, Table

from toolfleet.producer.catalog import read_entries
from toolfleet.shared import codec
from toolfleet.shared.aggregates import read_window
from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.quality import QualityRow, parse_duration, quality_rows
from toolfleet.worker.cli.support import console

__all__ = ["quality", "quality_table"]


def _duration(_ctx: click.Context, _param: click.Parameter, value: str) -> float:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def _fields(row: QualityRow) -> str:
    return ", ".join(f"{f.field} ({f.reason}) x{f.calls}" for f in row.failing_fields) or "-"


def quality_table(rows: list[QualityRow], title: str) -> Table:
    """The report's rows as a rich table (failing fields and statuses as text)."""
    table = Table(
        Column("function", overflow="fold"),
        Column("model", overflow="fold"),
        "calls",
        "not ok",
        Column("statuses", overflow="fold"),
        Column("failing fields", overflow="fold"),
        "wait p50/p95 ms",
        "run p50/p95 ms",
        title=title,
    )
    for row in rows:
        statuses = ", ".join(
            f"{s} {row.rates[s]:.0%}" for s, n in row.statuses.items() if s != "ok" and n
        )
        table.add_row(
            row.function,
            row.model,
            str(row.calls),
            f"{row.failed / row.calls:.0%}" if row.calls else "-",
            statuses or "-",
            _fields(row),
            f"{_ms(row.wait_p50_s)}/{_ms(row.wait_p95_s)}",
            f"{_ms(row.run_p50_s)}/{_ms(row.run_p95_s)}",
        )
    return table


def _csv(rows: list[QualityRow]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    statuses = sorted({s for row in rows for s in row.statuses})
    writer.writerow(
        ["function", "model", "calls", *(f"{s}_rate" for s in statuses), "failing_fields",
         "wait_p50_s", "wait_p95_s", "run_p50_s", "run_p95_s"]
    )  # fmt: skip
    for row in rows:
        writer.writerow(
            [row.function, row.model, row.calls, *(row.rates.get(s, 0.0) for s in statuses),
             "; ".join(f"{f.field}:{f.reason}:{f.calls}" for f in row.failing_fields),
             *("" if v is None else v
               for v in (row.wait_p50_s, row.wait_p95_s, row.run_p50_s, row.run_p95_s))]
        )  # fmt: skip
    return out.getvalue()


@click.command()
@click.option(
    "--since",
    "since_s",
    default="1h",
    show_default=True,
    callback=_duration,
    help="How far back: 90s, 15m, 1h, 2d (at most the aggregates' TTL, one day by default).",
)
@click.option("--model", help="Only this model (a name in TOOLFLEET_QUALITY_MODELS, or other).")
@click.option("--tool", "function", help="Only this function (e.g. ext_bfcl_math_gcd).")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["table", "json", "csv"]),
    default="table",
    show_default=True,
)
@click.pass_context
def quality(
    ctx: click.Context, since_s: float, model: str | None, function: str | None, fmt: str
) -> None:
    """Which model fails which tool: status rates, failing fields, wait and run percentiles.

    One row per tool x model, worst first (the highest share of calls not ok), from the
    per-minute aggregates the workers write at heartbeat time.
    """
    client: redis.Redis = ctx.obj.redis(socket_timeout=10)
    now = time.time()
    try:
        layout = KeyLayout.of(client, ctx.obj.settings.namespace)  # every group's, a cluster
        layout.learn(read_entries(client, layout.fleet, ctx.obj.settings.worker_ttl_s))
        window = read_window(client, layout.prefixes(), now - since_s, now)
    finally:
        client.close()
    rows = quality_rows(window, model=model, function=function)
    if fmt == "json":
        report = {
            "since": now - since_s,
            "until": now,
            "rows": [row.model_dump(mode="json") for row in rows],
        }
        click.echo(codec.dumps_str(report))
    elif fmt == "csv":
        click.echo(_csv(rows), nl=False)
    elif not rows:
        click.echo(f"no calls in the last {since_s:.0f} s")
    else:
        console.print(quality_table(rows, f"quality, last {since_s:.0f} s (worst first)"))
