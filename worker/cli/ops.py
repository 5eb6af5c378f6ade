"""Operations commands: ``events``, ``health`` and ``exporter`` (``top`` is :mod:`.top`)."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import click
import redis
import redis.cluster
from redis.backoff import NoBackoff
from redis.retry import Retry

from toolfleet.producer.catalog import read_entries
from toolfleet.shared import codec, failures
from toolfleet.shared.layout import KeyLayout
from toolfleet.shared.naming import events_key, outcome_key
from toolfleet.worker.cli.support import Outage
from toolfleet.worker.supervision.exporter import DEFAULT_PORT, run_exporter
from toolfleet.worker.supervision.health import check_live, check_ready

__all__ = ["events", "exporter", "find_call", "health", "watching_client"]


def watching_client(ctx: click.Context) -> redis.Redis:
    """A client for a command that rides out outages itself (:class:`Outage`).

    redis-py's own retries are off: they would spend seconds (ten attempts, backing off to
    1 s) inside one command before the command's loop hears of the outage, reports it, or
    sees Redis back.
    """
    return ctx.obj.redis(socket_timeout=5, retry=Retry(NoBackoff(), 0))  # type: ignore[no-any-return]


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
    client = watching_client(ctx)
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
