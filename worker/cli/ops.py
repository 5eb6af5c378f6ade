"""Operations commands: ``top``, ``events``, ``health`` and ``exporter``."""

from __future__ import annotations

import logging
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import click
import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry
from rich.console import Console, Group
from rich.live import Live
from rich.table import Column, Table

from toolfleet.producer.catalog import read_entries
from toolfleet.shared import codec, failures
from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.naming import (
    catalog_workers_key,
    dead_letters_key,
    events_key,
    outcome_key,
    queue_msgs_key,
    workers_key,
)
from toolfleet.worker.cli.support import Outage
from toolfleet.worker.cli.top_tenancy import tenancy_tables
from toolfleet.worker.supervision.exporter import DEFAULT_PORT, run_exporter
from toolfleet.worker.supervision.health import check_live, check_ready

__all__ = ["events", "exporter", "find_call", "health", "top"]

console = Console()

#: Seconds of events ``top`` summarises per function.
WINDOW_S = 60.0


def _watching_client(ctx: click.Context) -> redis.Redis:
    """A client for a command that rides out outages itself (:class:`Outage`).

    redis-py's own retries are off: they would spend seconds (ten attempts, backing off to
    1 s) inside one command before the command's loop hears of the outage, reports it, or
    sees Redis back.
    """
    return ctx.obj.redis(socket_timeout=5, retry=Retry(NoBackoff(), 0))  # type: ignore[no-any-return]


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


def render_top(
    client: redis.Redis, namespace: str, window_s: float = WINDOW_S, worker_ttl_s: float = 10.0
) -> Group:
    """One frame of ``toolfleet top``: queues, catalog, workers and per-function statistics.

    The catalog and its queues are the names a live worker serves
    (:func:`~toolfleet.producer.catalog.read_entries`); a heartbeat older than
    ``worker_ttl_s`` seconds does not count.
    """
    layout = KeyLayout.of(client, namespace)  # on a cluster: the fleet's slot, each group's
    by_name = read_entries(client, layout.fleet, worker_ttl_s)
    layout.learn(by_name)
    entries = list(by_name.values())
    queues = sorted({str(e.get("queue")) for e in entries})
    since = time.time() - worker_ttl_s
    pipe = client.pipeline(transaction=False)
    for queue in queues:
        pipe.hlen(queue_msgs_key(layout.of_queue(queue), queue))
        pipe.zcard(dead_letters_key(layout.of_queue(queue), queue))
        pipe.zrangebyscore(workers_key(layout.fleet, queue), since, "+inf")
    for name in sorted(by_name):
        pipe.zcount(catalog_workers_key(layout.fleet, name), since, "+inf")
    values = pipe.execute() if queues else []
    queue_table = Table("queue", "depth", "dead letters", "live workers", title="queues")
    workers: set[str] = set()
    for i, queue in enumerate(queues):
        depth, dead, live = values[3 * i : 3 * i + 3]
        workers |= {w.decode() for w in live}
        queue_table.add_row(queue, str(depth), str(dead), str(len(live)))
    catalog_table = Table(
        Column("function", overflow="fold"), "tool", "version", "schema", "workers",
        title="catalog",
    )  # fmt: skip
    for name, serving in zip(sorted(by_name), values[3 * len(queues) :], strict=True):
        entry = by_name[name]
        tool = f"{entry.get('slug', '')}/{entry.get('tool', '')}"
        catalog_table.add_row(name, tool, str(entry.get("version", "")),
                              str(entry.get("schema_hash", "")), str(serving))  # fmt: skip
    hosts = Counter(w.rsplit(":", 1)[0] for w in workers)
    worker_table = Table("host", "worker processes", title="workers")
    for host, count in sorted(hosts.items()):
        worker_table.add_row(host, str(count))
    events = [
        e for e in _recent_events(client, layout, window_s) if e.get("kind") == "tool_responded"
    ]
    by_function: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        by_function[str(event.get("function"))].append(event)
    function_table = Table(
        Column("function", overflow="fold"),  # wrapped whole, never cut, in 80 columns
        "calls/s",
        "busy",
        "p50 ms",
        "p99 ms",
        "errors",
        title=f"functions (last {window_s:.0f} s)",
    )
    for function, items in sorted(by_function.items()):
        runs = sorted(float(e["run_s"]) for e in items if e.get("run_s") is not None)
        errors = Counter(str(e.get("status")) for e in items if e.get("status") != "ok")
        function_table.add_row(
            function,
            f"{len(items) / window_s:.2f}",
            f"{_busy(items, window_s):.2f}",
            f"{_quantile(runs, 0.50) * 1000:.1f}" if runs else "-",
            f"{_quantile(runs, 0.99) * 1000:.1f}" if runs else "-",
            ", ".join(f"{s}: {n}" for s, n in sorted(errors.items())) or "-",
        )
    names = sorted(str(e.get("name")) for e in entries)
    queue_of = {name: str(entry.get("queue")) for name, entry in by_name.items()}
    tenancy = tenancy_tables(client, layout, names, queues, queue_of)
    return Group(queue_table, catalog_table, worker_table, function_table, *tenancy)


def _quantile(values: list[float], q: float) -> float:
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q * 100) - 1]


@click.command()
@click.option("--once", is_flag=True, help="Print one frame and exit.")
@click.option(
    "--interval", type=float, default=2.0, show_default=True, help="Seconds between frames."
)
@click.pass_context
def top(ctx: click.Context, once: bool, interval: float) -> None:
    """A live view of queues, workers and per-function calls/s, latency and errors.

    On a terminal the view is redrawn in place; to a pipe or a file (``toolfleet top |
    tee``, a log), each frame is printed whole, after a line with its UTC time.
    """
    client = _watching_client(ctx)
    namespace = ctx.obj.settings.namespace
    ttl_s = ctx.obj.settings.worker_ttl_s
    if once:
        console.print(render_top(client, namespace, worker_ttl_s=ttl_s))
        return
    outage = Outage(ctx.obj.settings.redis_url)
    first = render_top(client, namespace, worker_ttl_s=ttl_s)
    try:
        if console.is_terminal:
            with Live(first, console=console, refresh_per_second=4) as live:
                _follow(client, namespace, interval, outage, live.update, ttl_s)
        else:
            _print_frame(first)
            _follow(client, namespace, interval, outage, _print_frame, ttl_s)
    except KeyboardInterrupt:
        pass


def _print_frame(frame: Group) -> None:
    """Print ``frame`` whole, after a line with the time (``top`` without a terminal)."""
    console.print(time.strftime("toolfleet top at %Y-%m-%d %H:%M:%S UTC", time.gmtime()))
    console.print(frame)
    console.file.flush()


def _follow(
    client: redis.Redis,
    namespace: str,
    interval_s: float,
    outage: Outage,
    show: Callable[[Group], None],
    worker_ttl_s: float,
) -> None:
    """Render a frame every ``interval_s`` seconds and ``show`` it, riding out outages."""
    while True:
        time.sleep(interval_s)
        try:
            frame = render_top(client, namespace, worker_ttl_s=worker_ttl_s)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            time.sleep(outage.failed(exc))
            continue
        outage.recovered()
        show(frame)


@click.command()
@click.option(
    "--count", type=int, default=0, help="Stop after this many events (0: follow forever)."
)
@click.option("--from-start", is_flag=True, help="Start with the oldest event kept, not new ones.")
@click.option(
    "--call",
    "call_id",
    metavar="ID",
    default=None,
    help="Print what the fleet keeps of call ID (a failed one for TOOLFLEET_FAILURES_RETENTION_S, "
    "24 h by default) as one JSON line; exit 1 when it keeps nothing.",
)
@click.pass_context
def events(ctx: click.Context, count: int, from_start: bool, call_id: str | None) -> None:
    """Tail the lifecycle events stream as JSON lines (or find one call with --call)."""
    client = _watching_client(ctx)
    layout = KeyLayout.of(client, ctx.obj.settings.namespace)
    if call_id is not None:
        layout.learn(read_entries(client, layout.fleet, ctx.obj.settings.worker_ttl_s))
        found = find_call(client, layout.prefixes(), call_id)
        if found is None:
            click.echo(f"no outcome or failure is kept for call {call_id}", err=True)
            sys.exit(1)
        click.echo(codec.dumps_str(found))
        return
    outage = Outage(ctx.obj.settings.redis_url)
    start = "0-0" if from_start else "$"
    last: dict[Any, Any] = {}  # stream -> the id read up to
    seen, groups_read_at = 0, 0.0
    try:
        while not count or seen < count:
            try:
                if layout.cluster and time.monotonic() - groups_read_at > GROUPS_EVERY_S:
                    layout.learn(read_entries(client, layout.fleet, ctx.obj.settings.worker_ttl_s))
                    groups_read_at = time.monotonic()
                for prefix in layout.prefixes():
                    if events_key(prefix) not in last:
                        last[events_key(prefix)] = _position(client, events_key(prefix), start)
                batch = _read_events(client, last)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                time.sleep(outage.failed(exc))
                continue
            outage.recovered()
            for stream, rows in batch:
                for entry_id, fields in rows:
                    last[stream] = entry_id
                    click.echo(fields[b"event"].decode())
                    seen += 1
                    if count and seen >= count:
                        return
    except KeyboardInterrupt:
        pass


def find_call(client: redis.Redis, prefixes: list[str], call_id: str) -> dict[str, Any] | None:
    """What the fleet keeps of ``call_id``, or ``None``.

    ``{"kind": "outcome", ...}``: its recorded result (any status, for the outcome TTL;
    one ``GET`` per prefix); else ``{"kind": "failure", ...}``: its record in the failures
    index (a failed call, for the failures retention; a ``ZSCAN`` walk of each prefix's).
    """
    for prefix in prefixes:
        raw: Any = client.get(outcome_key(prefix, call_id))
        if raw is None:
            continue
        try:
            envelope = codec.loads(raw)
        except codec.DecodeError:
            return {"kind": "outcome", "id": call_id, "status": "unreadable"}
        result = envelope.get("result", envelope) if isinstance(envelope, dict) else {}
        return {"kind": "outcome", **result}
    for record in failures.search(client, prefixes, call_id):
        if record.get("id") == call_id:
            return {"kind": "failure", **record}
    return None


#: Seconds between two reads of the catalog by ``events`` on a cluster (new groups' streams).
GROUPS_EVERY_S = 5.0
#: Seconds ``events`` waits for the next event (on a cluster: split between the groups).
EVENTS_WAIT_MS = 1000


def _read_events(client: redis.Redis, last: dict[Any, Any]) -> list[tuple[str, Any]]:
    """The next events of the streams ``last`` names: ``[(stream, [(id, fields)...])]``.

    One stream (a plain Redis): one blocking ``XREAD``. Several (a cluster: each group's
    stream in its own slot, which one ``XREAD`` cannot span): one ``XREAD`` per stream in
    turn, the wait split between them.
    """
    if len(last) == 1:
        batch: Any = client.xread(last, block=EVENTS_WAIT_MS, count=100)
        return [(_text(stream), rows) for stream, rows in batch or []]
    wait_ms = max(1, EVENTS_WAIT_MS // len(last))
    found: list[tuple[str, Any]] = []
    for stream, position in list(last.items()):
        batch = client.xread({stream: position}, block=wait_ms, count=100)
        found.extend((_text(name), rows) for name, rows in batch or [])
    return found


def _position(client: redis.Redis, stream: str, start: str) -> Any:
    """Where ``events`` starts reading ``stream``: ``start``, with ``$`` made an id on a cluster.

    ``$`` (only what comes next) is resolved to the stream's newest id, so that an event
    added while another group's stream is being read is not skipped.
    """
    if start != "$" or not isinstance(client, redis.cluster.RedisCluster):
        return start
    newest: Any = client.xrevrange(stream, count=1)
    return newest[0][0] if newest else "0-0"


def _text(name: Any) -> str:
    return name.decode() if isinstance(name, bytes) else str(name)


@click.command()
@click.option(
    "--live",
    "mode",
    flag_value="live",
    help="Liveness: worker processes are healthy (no Redis needed).",
)
@click.option(
    "--ready",
    "mode",
    flag_value="ready",
    help="Readiness: live, extensions loaded, Redis reachable.",
)
@click.pass_context
def health(ctx: click.Context, mode: str | None) -> None:
    """Kubernetes exec probe: exit 0 when healthy, 1 otherwise (the reason on stderr)."""
    settings = ctx.obj.settings
    if mode is None:
        raise click.UsageError("pass --live or --ready")
    if mode == "live":
        report = check_live(settings.health_dir, settings.health_stale_s)
    else:
        report = check_ready(
            settings.health_dir,
            settings.health_stale_s,
            settings.redis_url,
            factory=settings.redis_client,
        )
    click.echo(report.reason, err=not report.ok)
    sys.exit(0 if report.ok else 1)


@click.command()
@click.option(
    "--port",
    type=click.IntRange(1, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port of /metrics, /livez and /readyz.",
)
@click.pass_obj
def exporter(obj: Any, port: int) -> None:
    """Serve the fleet-wide gauges (queue depth, dead letters, workers per queue) once.

    Run one per fleet (namespace on a Redis): the supervisors no longer export these, so
    a dashboard's sum over them counts each queue once.
    """
    settings = obj.settings
    factory = settings.redis_client
    url = "" if factory else obj.require_url()
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        code = run_exporter(port, url, settings.namespace, settings.worker_ttl_s, factory=factory)
    except OSError as exc:
        raise click.ClickException(f"cannot serve on port {port}: {exc}") from exc
    sys.exit(code)
