"""The ``toolfleet`` command line.

Global options, before or after the subcommand: ``--redis-url`` (``TOOLFLEET_REDIS_URL``),
``--namespace`` (``TOOLFLEET_NAMESPACE``), ``--debug`` (see :mod:`.cli_support`). Only
``demo`` starts an embedded Redis when no URL is set.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import time
import uuid
from pathlib import Path
from types import FrameType

import click
import redis
from pydantic import ValidationError
from rich.text import Text

from toolfleet.shared import codec
from toolfleet.shared.aggregates import read_window
from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.export import FORMATS
from toolfleet.shared.naming import all_keys_pattern, default_queue_for
from toolfleet.shared.quality import quality_rows
from toolfleet.shared.urls import redacted_url
from toolfleet.shared.wire import Status, ToolCallResult
from toolfleet.worker.cli.admin import extensions, switch
from toolfleet.worker.cli.demo_report import (
    NEXT_STEP,
    host_notices,
    mismatch_lines,
    quality_part,
    replay_table,
    unknown_table,
)
from toolfleet.worker.cli.limits import limits
from toolfleet.worker.cli.mcp_serve import mcp
from toolfleet.worker.cli.ops import events, exporter, health
from toolfleet.worker.cli.quality import quality
from toolfleet.worker.cli.support import (
    EXIT_FAILED,
    CliState,
    ToolfleetGroup,
    console,
    global_options,
)
from toolfleet.worker.cli.tool_text import display_text
from toolfleet.worker.cli.top import top
from toolfleet.worker.cli.ui import ui
from toolfleet.worker.devtools.local_fleet import LocalFleet, delete_namespace
from toolfleet.worker.devtools.replay import (
    Expected,
    ReplayReport,
    load_cases,
    replay,
    sample_file,
)
from toolfleet.worker.devtools.scaffold import write_extension
from toolfleet.worker.registry.redaction import Redactor
from toolfleet.worker.supervision.logs import configure_logging
from toolfleet.worker.supervision.redis_factory import load_factory
from toolfleet.worker.supervision.supervisor import Supervisor, WorkerOptions

__all__ = ["main"]


#: Statuses a producer answers when Redis may have gone away during the call.
REDIS_MAY_BE_GONE = frozenset({Status.NOT_AVAILABLE, Status.TIMEOUT})


@click.group(cls=ToolfleetGroup, context_settings={"help_option_names": ["-h", "--help"]})
# the installed distribution's version (importlib.metadata), e.g. "toolfleet 0.1.0"
@click.version_option(
    package_name="toolfleet", prog_name="toolfleet", message="%(prog)s %(version)s"
)
@click.pass_context
def cli(ctx: click.Context) -> None:
    """toolfleet: run the tools LLMs call on a fleet of workers behind Redis."""
    ctx.ensure_object(CliState)


cli.params.extend(global_options())


@cli.command()
@click.option(
    "-p",
    "--processes",
    type=int,
    default=os.cpu_count() or 1,
    show_default=True,
    help="Worker processes to supervise.",
)
@click.option(
    "-t", "--threads", type=int, default=8, show_default=True, help="Threads per process."
)
@click.option("-Q", "--queues", "queues", multiple=True, help="Queues to consume (default: all).")
@click.option(
    "--extension",
    "extensions",
    multiple=True,
    metavar="MODULE:ATTR",
    help="Load an extension that is not installed as an entry point (repeatable).",
)
@click.option(
    "--redis-client",
    "redis_client",
    metavar="MODULE:ATTR",
    help="A factory returning a ready redis.Redis (e.g. Sentinel's master_for), used "
    "instead of --redis-url; env TOOLFLEET_REDIS_CLIENT.",
)
@click.option(
    "--queue-group",
    "queue_group",
    metavar="NAME",
    help="The queue group these workers serve: on a Redis Cluster its keys share one slot "
    "(docs/cluster.md); env TOOLFLEET_QUEUE_GROUP, default 'default'.",
)
@click.pass_obj
def worker(
    obj: CliState,
    processes: int,
    threads: int,
    queues: tuple[str, ...],
    extensions: tuple[str, ...],
    redis_client: str | None,
    queue_group: str | None,
) -> None:
    """Run and supervise worker processes until SIGTERM (then drain)."""
    factory = redis_client or obj.settings.redis_client
    if factory:
        load_factory(factory)  # fail here, once, rather than in every process
    else:
        obj.require_url()
    # the supervisor's own lines as the workers write theirs: TOOLFLEET_LOG_FORMAT, scrubbed
    supervisor = f"{socket.gethostname()}:{os.getpid()} supervisor"
    configure_logging(
        "INFO", obj.settings.log_format, supervisor, Redactor(obj.settings.secret_values())
    )
    options = WorkerOptions(
        obj.settings.model_copy(
            update={"redis_client": factory, "queue_group": queue_group or obj.settings.queue_group}
        ),
        processes=max(1, processes),
        threads=max(1, threads),
        queues=list(queues),
        extensions=list(extensions),
    )
    sys.exit(Supervisor(options).run())


@cli.command()
@click.argument("function")
@click.argument("arguments", default="{}")
@click.option(
    "--timeout",
    "timeout_s",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds until the deadline.",
)
@click.pass_obj
def call(obj: CliState, function: str, arguments: str, timeout_s: float) -> None:
    """Call FUNCTION with ARGUMENTS (a JSON string); print the result. Exit 0 only for ok."""
    with obj.tool_client() as client:
        result = client.call(function, arguments, timeout_s=timeout_s)
    if result.status in REDIS_MAY_BE_GONE:
        obj.ping()  # Redis went away during the call: say so instead
    click.echo(codec.dumps_str(result.model_dump(mode="json")))
    sys.exit(0 if result.ok else 1)


@cli.command()
@click.option("--account", help="List only what this account may call.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(list(FORMATS)),
    default="openai",
    show_default=True,
)
@click.option(
    "--all", "include_unavailable", is_flag=True, help="Include tools with no live worker."
)
@click.pass_obj
def tools(obj: CliState, account: str | None, fmt: str, include_unavailable: bool) -> None:
    """Print the fleet's tools as JSON, in a model API's format, or as text to read.

    Standard output is the JSON list alone, ``[]`` included; when it is empty, a line on
    standard error says why (no worker has published tools, or none serves them now).
    ``--format display`` prints text for people instead: per tool its names,
    descriptions and parameters (type, required or optional), wrapped to the terminal
    (``client.tools(format="display")`` gives the same as JSON).
    """
    with obj.tool_client() as client:
        listed = client.tools(account=account, format=fmt, include_unavailable=include_unavailable)
        catalogued = [] if listed or include_unavailable else client.tools(
            account=account, format=fmt, include_unavailable=True
        )  # fmt: skip
    if fmt == "display":
        click.echo(display_text(listed, shutil.get_terminal_size().columns), nl=False)
    else:
        click.echo(codec.dumps_str(listed))
    if not listed:
        click.echo(_why_no_tools(obj, account, len(catalogued)), err=True)


def _why_no_tools(obj: CliState, account: str | None, catalogued: int) -> str:
    """The stderr line of an empty ``toolfleet tools``."""
    url = redacted_url(obj.settings.redis_url)
    where = f"namespace {obj.settings.namespace!r}" + (f" at {url}" if url else "")
    who = f" for account {account!r}" if account else ""
    if catalogued:
        return (
            f"no tools{who}: {catalogued} catalogued in {where}, but no live worker serves "
            "them (`toolfleet tools --all` lists them)"
        )
    return (
        f"no tools{who}: no worker has published any in {where} (start one with `toolfleet worker`)"
    )


@cli.command(name="replay")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True)
@click.pass_obj
def replay_command(obj: CliState, files: tuple[Path, ...], timeout_s: float) -> None:
    """Replay FILES (BFCL exec files or sample calls) through a running fleet.

    Exits 1 on any mismatch.
    """
    report = _replay(obj, *_load(list(files)), timeout_s, [path.name for path in files])
    sys.exit(0 if report.ok else 1)


def _load(paths: list[Path]) -> tuple[list[Expected], int]:
    """The cases of ``paths`` and how many entries they came from (a usage error if bad)."""
    try:
        return load_cases(paths)
    except (OSError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


@cli.command()
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-p", "--processes", type=int, default=2, show_default=True)
@click.option("-t", "--threads", type=int, default=8, show_default=True)
@click.option("--timeout", "timeout_s", type=float, default=60.0, show_default=True)
@click.pass_obj
def demo(
    obj: CliState, files: tuple[Path, ...], processes: int, threads: int, timeout_s: float
) -> None:
    """Run a whole fleet locally and replay FILES (default: a bundled sample).

    Starts Redis (embedded unless a URL is set) and 2 worker processes, replays, prints a
    report (the replay's figures and statuses, each with its meaning; the calls not ok by
    tool and model, as `toolfleet quality` counts them; unknown names asked for; the next
    command to try), and stops everything. Exit 0 when all matched. The models the files
    name are counted by name unless TOOLFLEET_QUALITY_MODELS lists others.
    """
    settings = obj.settings.model_copy()
    paths = list(files) or [sample_file()]
    cases, entries = _load(paths)
    if not settings.quality_models:
        named = sorted({c.llmclient for c in cases if c.llmclient})[:64]
        settings = settings.model_copy(update={"quality_models": named})
    if settings.redis_url:  # a shared Redis: keep the demo's keys apart and remove them after
        obj.ping()
        settings.namespace = f"{settings.namespace}.demo.{uuid.uuid4().hex[:8]}"
    where = f"Redis {redacted_url(settings.redis_url)}" if settings.redis_url else "embedded Redis"
    source = paths[0].name if len(paths) == 1 else f"{len(paths)} files"
    console.print(
        Text.assemble(
            ("toolfleet demo", "bold"),
            f": {where}, {processes} worker processes, {len(cases)} calls from {source}",
        ),
        highlight=False,
    )
    _exit_cleanly_on_termination()
    options = WorkerOptions(
        settings.model_copy(update={"metrics_port": 0}),
        processes=processes,
        threads=threads,
        log_level="ERROR",  # what a worker only warns about, the demo says in its own words
    )
    fleet = LocalFleet(options, ready_queues=[default_queue_for("bfcl")])
    try:
        fleet.start()
        on_fleet = CliState(settings.model_copy(update={"redis_url": fleet.redis_url}))
        on_fleet.debug = obj.debug
        _print_host_notices(on_fleet)
        report = _replay(on_fleet, cases, entries, timeout_s, [p.name for p in paths])
        _print_quality(on_fleet, report.answered_by_workers, settings.heartbeat_interval_s)
        console.print()
        console.print(NEXT_STEP, markup=False, highlight=False)
    finally:
        _ignore_termination()  # a Ctrl-C while the fleet stops must not cut the clean-up short
        fleet.stop()
        if obj.settings.redis_url:
            _delete_namespace(obj.settings.redis_url, settings.namespace)
    sys.exit(0 if report.ok else 1)


@cli.command(name="new")
@click.argument("name")
def new(name: str) -> None:
    """Write a new extension folder NAME: a manifest, one tool and a test that passes.

    NAME is the extension's slug and the folder's name (e.g. demo-ext), created in the
    current folder; `pytest` in it runs the test (toolfleet.testing: a call answered as a
    worker answers it, then a real fleet on an embedded Redis).
    """
    try:
        written = write_extension(Path.cwd(), name)
    except ConfigurationError as exc:
        raise click.ClickException(str(exc)) from None
    for path in written:
        click.echo(f"wrote {path.relative_to(Path.cwd())}")
    click.echo(f"next: cd {name} && pytest")


def _exit_cleanly_on_termination() -> None:
    """Turn SIGTERM and SIGHUP into ``SystemExit`` so ``finally`` blocks stop the fleet."""

    def handler(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def _ignore_termination() -> None:
    """Ignore Ctrl-C, SIGTERM and SIGHUP from now on (the demo's bounded clean-up)."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)


def _replay(
    state: CliState, cases: list[Expected], entries: int, timeout_s: float, files: list[str]
) -> ReplayReport:
    """Replay ``cases``; stop at the first failed call if Redis is gone meanwhile."""

    def on_result(result: ToolCallResult) -> None:
        if result.status in REDIS_MAY_BE_GONE:
            state.ping()  # raises ConnectionFailed: one line instead of a mismatch per call

    with state.tool_client() as client:
        report = replay(client, cases, entries, timeout_s=timeout_s, on_result=on_result)
    console.print()
    console.print(replay_table(report, files))
    for line in mismatch_lines(report, console.width):
        console.print(line, style="red", markup=False, highlight=False)
    return report


def _print_host_notices(state: CliState) -> None:
    """A sentence for each extension the demo's workers could not serve on this host."""
    with state.tool_client() as client:
        errors = client.extension_errors()
    for notice in host_notices(errors):
        console.print(notice, markup=False, highlight=False)


def _print_quality(state: CliState, calls: int, heartbeat_s: float) -> None:
    """Print the quality report of the replay once the workers' heartbeats have written it.

    Waits at most three heartbeats plus 5 s for ``calls`` calls (those a worker answered)
    to show in the aggregates, then prints what is there.
    """
    client = state.redis()
    deadline = time.monotonic() + 3 * heartbeat_s + 5.0
    try:
        while True:
            window = read_window(client, state.settings.namespace, time.time() - 3600)
            seen = sum(cell.calls for cell in window.totals())
            if seen >= calls or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        client.close()
    rows = quality_rows(window)
    if rows:
        table, notes = quality_part(rows, console.width)
        console.print()
        console.print(table)
        for note in notes:
            console.print(note, markup=False, highlight=False)
    _print_unknown_functions()


def _print_unknown_functions() -> None:
    """The names this process's producer answered ``unknown_function`` for, by model."""
    from toolfleet.producer import metrics

    asked = [
        (sample.labels["model"], sample.labels["asked"], int(sample.value))
        for family in metrics.REGISTRY.collect()
        for sample in family.samples
        if sample.name == "toolfleet_client_unknown_functions_total" and sample.value
    ]
    if asked:
        console.print()
        console.print(unknown_table(asked))


def _delete_namespace(url: str, namespace: str) -> None:
    try:
        delete_namespace(url, namespace)
    except redis.RedisError as exc:
        click.echo(
            f"could not remove the demo's keys ({all_keys_pattern(namespace)}): {exc}", err=True
        )


cli.add_command(switch)
cli.add_command(limits)
cli.add_command(extensions)
cli.add_command(top)
cli.add_command(events)
cli.add_command(health)
cli.add_command(exporter)
cli.add_command(mcp)
cli.add_command(ui)
cli.add_command(quality)


def main() -> None:
    """Entry point of the ``toolfleet`` console script."""
    try:
        cli()
    except ValidationError as exc:  # a TOOLFLEET_* variable that does not parse
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        click.echo(f"error: setting {where}: {first['msg']} (TOOLFLEET_{where.upper()})", err=True)
        sys.exit(EXIT_FAILED)
