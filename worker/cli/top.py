"""``toolfleet top``: queues, workers and per-function calls/s, latency and errors, live."""

from __future__ import annotations

import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import click
import redis
from rich.console import Group, RenderableType
from rich.live import Live
from rich.table import Column, Table
from rich.text import Text

from toolfleet.producer.catalog import read_entries
from toolfleet.shared import codec
from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.naming import (
    catalog_workers_key,
    dead_letters_key,
    events_key,
    queue_msgs_key,
    workers_key,
)
from toolfleet.worker.cli.ops import watching_client
from toolfleet.worker.cli.support import Outage, console
from toolfleet.worker.cli.top_layout import Section, fit_rows, middle_cut
from toolfleet.worker.cli.top_tenancy import tenancy_sections

__all__ = ["render_top", "top"]


#: Seconds of events ``top`` summarises per function.
WINDOW_S = 60.0
#: Columns the function table's numbers and the gaps between its columns take.
_FUNCTION_COLUMNS_W = 7 + 4 + 6 + 6 + 5 * 2
#: Columns the errors cell may take before it is cut with an ellipsis (count first).
_ERRORS_W = 18


def _recent_events(client: redis.Redis, layout: KeyLayout, window_s: float) -> list[dict[str, Any]]:
    """The last ``window_s`` seconds of events of every group's stream (one on a plain Redis)."""
    since_ms = int((time.time() - window_s) * 1000)
    out = []
    for prefix in layout.prefixes():
        key = events_key(prefix)
        rows: Any = client.xrange(key, min=f"{since_ms}-0", max="+", count=100_000)
        for _id, fields in rows:
            try:
                out.append(codec.loads(fields[b"event"]))
            except (KeyError, codec.DecodeError):
                continue
    return out


def _busy(answered: list[dict[str, Any]], window_s: float) -> float:
    """Mean number of calls running over the window: their run seconds over its seconds.

    Only time spent running counts: a call answered without running (invalid arguments,
    unknown function, past its deadline) adds nothing. The stream gets a call's events when
    it is answered, so a call still running shows once it finishes.
    """
    return sum(float(e["run_s"]) for e in answered if e.get("run_s") is not None) / window_s


def _quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


def render_top(
    client: redis.Redis,
    namespace: str,
    window_s: float = WINDOW_S,
    worker_ttl_s: float = 10.0,
    *,
    width: int = 80,
    height: int | None = None,
    catalog: bool = False,
) -> Group:
    """One frame of ``toolfleet top``.

    A line summing up the catalog (functions per extension), then the queues (depth, dead
    letters, live worker processes), the workers (processes per host), the functions
    called in the last ``window_s`` seconds (calls/s, busy, p50/p99 run time, errors by
    status; busiest first) and what tenancy limits now (lanes, breakers and slots,
    quotas). With ``catalog``, the whole catalog follows, one function a line.

    The catalog and its queues are the names a live worker serves
    (:func:`~toolfleet.producer.catalog.read_entries`); a heartbeat older than
    ``worker_ttl_s`` seconds does not count.

    Args:
        client: Redis client.
        namespace: the fleet's namespace.
        window_s: seconds of events the function table sums up.
        worker_ttl_s: seconds a heartbeat counts.
        width: columns to draw in (names are cut in the middle to keep rows one line).
        height: lines the frame may take (a terminal's): tables longer than fits lose
            their lightest rows, longest table first, with a ``+N more`` line; ``None``:
            every row.
        catalog: add the catalog table (not fitted into ``height``).
    """
    layout = KeyLayout.of(client, namespace)  # on a cluster: the fleet's slot, each group's
    by_name = read_entries(client, layout.fleet, worker_ttl_s)
    layout.learn(by_name)
    names = sorted(by_name)
    queues = sorted({str(e.get("queue")) for e in by_name.values()})
    since = time.time() - worker_ttl_s
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.hlen(queue_msgs_key(layout.of_queue(queue), queue))
        pipe.zcard(dead_letters_key(layout.of_queue(queue), queue))
        pipe.zrangebyscore(workers_key(layout.fleet, queue), since, "+inf")
    if catalog:
        for name in names:
            pipe.zcount(catalog_workers_key(layout.fleet, name), since, "+inf")
    values = pipe.execute() if queues else []
    queue_section = Section("queues", ("queue", "depth", "dead letters", "live workers"),
                            noun="queues", empty="no queue: no worker serves anything")  # fmt: skip
    workers: set[str] = set()
    for i, queue in enumerate(queues):
        depth, dead, live = values[3 * i : 3 * i + 3]
        workers |= {w.decode() for w in live}
        queue_section.rows.append((depth + dead, [queue, str(depth), str(dead), str(len(live))]))
    hosts = Counter(w.rsplit(":", 1)[0] for w in workers)
    worker_section = Section("workers", ("host", "worker processes"), noun="hosts")
    for host, count in sorted(hosts.items()):
        worker_section.rows.append((count, [host, str(count)]))
    function_section = _functions(client, layout, window_s, width)
    queue_of = {name: str(entry.get("queue")) for name, entry in by_name.items()}
    sections = [queue_section, worker_section, function_section]
    sections += tenancy_sections(client, layout, names, queues, queue_of)
    header = _summary(by_name)
    keep: list[int | None] = [None] * len(sections)
    if height is not None:
        keep = list(fit_rows(console, sections, width, height - 2))
    parts: list[RenderableType] = [header]
    parts += [section.table(kept) for section, kept in zip(sections, keep, strict=True)]
    if catalog:
        parts.append(_catalog(by_name, values[3 * len(queues) :]))
    return Group(*parts)


def _summary(by_name: dict[str, dict[str, Any]]) -> Text:
    """The catalog in one line: how many functions, and how many of each extension."""
    slugs = Counter(str(entry.get("slug", "?")) for entry in by_name.values())
    per = ", ".join(f"{slug} {n}" for slug, n in sorted(slugs.items(), key=lambda i: (-i[1], i[0])))
    text = f"catalog: {_count(len(by_name), 'function')} in {_count(len(slugs), 'extension')}"
    return Text(f"{text}: {per}" if per else text, no_wrap=True, overflow="ellipsis")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _functions(client: redis.Redis, layout: KeyLayout, window_s: float, width: int) -> Section:
    """The per-function statistics of the last ``window_s`` seconds, busiest first."""
    events = [
        e for e in _recent_events(client, layout, window_s) if e.get("kind") == "tool_responded"
    ]
    by_function: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_function[str(event.get("function"))].append(event)
    section = Section(
        f"functions (last {window_s:.0f} s)",
        ("function", "calls/s", "busy", "p50 ms", "p99 ms", "errors"),
        noun="functions",
        empty=f"no calls in the last {window_s:.0f} s",
    )
    rows: list[tuple[float, list[str]]] = []
    for function, items in by_function.items():
        runs = sorted(float(e["run_s"]) for e in items if e.get("run_s") is not None)
        errors = Counter(str(e.get("status")) for e in items if e.get("status") != "ok")
        rows.append((len(items), [
            function,
            f"{len(items) / window_s:.2f}",
            f"{_busy(items, window_s):.2f}",
            f"{_quantile(runs, 0.50) * 1000:.1f}" if runs else "-",
            f"{_quantile(runs, 0.99) * 1000:.1f}" if runs else "-",
            ", ".join(f"{n} {s}" for s, n in errors.most_common()) or "-",
        ]))  # fmt: skip
    rows.sort(key=lambda row: (-row[0], row[1][0]))
    room = width - 1 - _FUNCTION_COLUMNS_W  # for the name and the errors
    longest_name = max([len("function"), *(len(r[1][0]) for r in rows)])
    errors_w = max([len("errors"), *(len(r[1][5]) for r in rows)])
    errors_w = min(errors_w, max(_ERRORS_W, room - longest_name))
    name_w = max(12, room - errors_w)
    section.rows = [
        (weight, [middle_cut(cells[0], name_w), *cells[1:5], _cut(cells[5], errors_w)])
        for weight, cells in rows
    ]
    return section


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _catalog(by_name: dict[str, dict[str, Any]], serving: list[int]) -> Table:
    """Every catalogued function: its tool, version, schema hash and live workers."""
    table = Table(
        Column("function", overflow="fold"), "tool", "version", "schema", "workers",
        title="catalog",
    )  # fmt: skip
    for name, count in zip(sorted(by_name), serving, strict=True):
        entry = by_name[name]
        tool = f"{entry.get('slug', '')}/{entry.get('tool', '')}"
        table.add_row(name, tool, str(entry.get("version", "")),
                      str(entry.get("schema_hash", "")), str(count))  # fmt: skip
    return table


@click.command()
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option(
    "--interval", type=float, default=2.0, show_default=True, help="Seconds between frames."
)
@click.option(
    "--catalog",
    is_flag=True,
    help="Add the whole catalog, one function a line (tool, version, schema, workers).",
)
@click.pass_context
def top(ctx: click.Context, once: bool, interval: float, catalog: bool) -> None:
    """A live view of queues, workers and per-function calls/s, latency and errors.

    On a terminal the view is redrawn in place and fits the window: the catalog is one
    line (functions per extension), and a table longer than the window allows shows its
    busiest rows and how many more there are. To a pipe or a file (``toolfleet top |
    tee``, a log), or with ``--once``, each frame is printed whole, after a line with its
    UTC time when following.
    """
    client = watching_client(ctx)
    namespace = ctx.obj.settings.namespace
    ttl_s = ctx.obj.settings.worker_ttl_s
    live_view = console.is_terminal and not once

    def frame() -> Group:
        size = console.size
        height = size.height if live_view else None
        return render_top(client, namespace, worker_ttl_s=ttl_s, width=size.width,
                          height=height, catalog=catalog)  # fmt: skip

    if once:
        console.print(frame())
        return
    outage = Outage(ctx.obj.settings.redis_url)
    first = frame()
    try:
        if live_view:
            with Live(first, console=console, auto_refresh=False) as live:
                _follow(frame, interval, outage, lambda f: live.update(f, refresh=True))
        else:
            _print_frame(first)
            _follow(frame, interval, outage, _print_frame)
    except KeyboardInterrupt:
        pass


def _print_frame(frame: Group) -> None:
    """Print ``frame`` whole, after a line with the time (``top`` without a terminal)."""
    console.print(time.strftime("toolfleet top at %Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    console.print(frame)
    console.file.flush()


def _follow(
    frame: Callable[[], Group],
    interval_s: float,
    outage: Outage,
    show: Callable[[Group], None],
) -> None:
    """Render a frame every ``interval_s`` seconds and ``show`` it, riding out outages."""
    while True:
        time.sleep(interval_s)
        try:
            rendered = frame()
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            time.sleep(outage.failed(exc))
            continue
        outage.recovered()
        show(rendered)
