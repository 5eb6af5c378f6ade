"""Shared fixtures: a real Redis, a unique namespace, worker fleets started through the CLI, and
clients of both kinds behind one blocking facade (:class:`Either`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import pytest
import redis
from pydantic_settings import BaseSettings, SettingsConfigDict

from toolfleet.producer import AsyncToolClient, CallEvent, ToolClient
from toolfleet.shared import ToolCallResult, codec
from toolfleet.shared.naming import actor_name_for, catalog_key, workers_key
from toolfleet.shared.urls import redacted_url

TESTS = Path(__file__).resolve().parent


class TestData(BaseSettings):
    """Data the repository does not ship, named like every setting (``TOOLFLEET_*``).

    Attributes:
        bfcl_dir: ``TOOLFLEET_BFCL_DIR``, a folder holding the BFCL files (``BFCL_v3_*.json``,
            ``possible_answer/``, and the expected results under ``derived/``); ``None``
            skips the tests that replay them.
    """

    model_config = SettingsConfigDict(env_prefix="TOOLFLEET_", extra="ignore")

    bfcl_dir: Path | None = None


BFCL_DATA: Path | None = TestData().bfcl_dir
#: the public BFCL files, at the last Gorilla commit with their ``BFCL_v3_*`` names; which
#: file comes from where: docs/getting-started.md, "The tests' BFCL folder"
BFCL_SOURCE = (
    "https://github.com/ShishirPatil/gorilla/tree/cd9429ccf3d4d04156affe883c495b3b047e6b64/"
    "berkeley-function-call-leaderboard/bfcl_eval/data"
)


def bfcl_missing(what: str) -> str:
    """The skip message of a test that needs BFCL data: what is missing and how to name it.

    Unset, the message is the same for every such test (it names no file), so pytest's
    summary folds them into one line with their count; a folder that lacks a file names
    the file, one line per file."""
    if BFCL_DATA is None:
        return f"BFCL data: TOOLFLEET_BFCL_DIR is not set (public files: {BFCL_SOURCE})"
    return f"BFCL data: {what} not in {BFCL_DATA} (TOOLFLEET_BFCL_DIR; public files: {BFCL_SOURCE})"


def bfcl_unavailable(what: str) -> NoReturn:
    """Skip a test that needs the BFCL file ``what`` (a path under ``TOOLFLEET_BFCL_DIR``).

    Not set: a skip wherever the run is (the data is not part of the repository). Set but
    without the file: a broken setting, so :func:`unavailable` (a failure in CI)."""
    if BFCL_DATA is None:
        pytest.skip(bfcl_missing(what))
    unavailable(bfcl_missing(what))


def bfcl_file(*parts: str) -> Path:
    """``parts`` under ``TOOLFLEET_BFCL_DIR``, else :func:`bfcl_unavailable` (data, no install)."""
    if BFCL_DATA is None or not BFCL_DATA.joinpath(*parts).is_file():
        bfcl_unavailable("/".join(parts))
    return BFCL_DATA.joinpath(*parts)


TEST_QUEUE = "tools.fleet-test"
#: A function the ``idle_namespace`` catalog lists on a queue nobody consumes.
IDLE = "ext_idle_noop"
IDLE_QUEUE = "tools.idle"
#: Seconds an answer bound to a deadline or a time limit may come late on a loaded 2-core
#: machine (a CPU hog beside the suite): the margins of the tests that time such answers.
LATE_S = 1.0
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Leave what the suite put in this process's heap out of the garbage collector's scans.

    A test process that has run many files (pytest-xdist) holds a large heap; a full
    collection triggered by a test's own allocations scans all of it and pauses every
    thread of the process, the client's deadline and reply threads too, for seconds on a
    loaded machine. The tests that time answers run their measured part inside this.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def unavailable(reason: str) -> NoReturn:
    """Skip the test on a developer's machine, fail it in CI: ``reason`` names what is
    missing, and CI installs everything a test needs (``.ci/run``), so there a skip
    would hide a broken install."""
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def default_sigint() -> None:
    """``preexec_fn`` of a child a test stops with SIGINT (a Ctrl-C): SIGINT at its default in
    the child even when the test run inherited it ignored, as every background job of a
    non-interactive shell (``pytest ... &`` in a script) does, and its children after it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sandbox_reason(config: Any = None) -> str | None:
    """Why the python tool's bubblewrap sandbox cannot start on this host for ``config`` (a
    ``PythonToolConfig``; the default one when ``None``), or ``None`` when it can."""
    from toolfleet.extensions.python import PythonToolConfig
    from toolfleet.extensions.python._sandbox import unavailable_reason

    return unavailable_reason(config if config is not None else PythonToolConfig())


def require_sandbox(config: Any = None) -> None:
    """Skip locally, fail in CI (:func:`unavailable`), unless the python tool's sandbox
    starts on this host (:func:`sandbox_reason`). Where it cannot, the fleet does not serve
    the tool and says why: the tests of that case
    (``test_secrets.test_python_tool_is_refused_and_reported_without_isolation``,
    ``test_cli.test_demo_without_bubblewrap_says_so_in_one_warning_line``) run everywhere,
    and ``.ci/without-bwrap`` runs the sandbox's test files as on a host without it.
    """
    reason = sandbox_reason(config)
    if reason:
        unavailable(reason)


def without_unserved_python(errors: dict[str, str]) -> dict[str, str]:
    """``errors`` (source -> why, as a fleet or ``extensions check`` reports them) less the
    python tool's, which a host that cannot start its sandbox must report, with the reason;
    unchanged on a host that can."""
    reason = sandbox_reason()
    if reason is None:
        return errors
    python = {k: v for k, v in errors.items() if k.startswith("entry point python ")}
    assert len(python) == 1 and reason in next(iter(python.values())), errors
    return {k: v for k, v in errors.items() if k not in python}


# Which Redis the session's tests used, said in pytest's closing summary (CI prints it).
REDIS_USED: list[str] = []


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in sorted(set(REDIS_USED)):
        terminalreporter.write_line(f"toolfleet tests used {line}")


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker: hand the Redis it used to the controller's summary."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["toolfleet_redis_used"] = list(REDIS_USED)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """In the pytest-xdist controller: gather what each worker's tests used."""
    REDIS_USED.extend(getattr(node, "workeroutput", {}).get("toolfleet_redis_used", []))


def _answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """TOOLFLEET_TEST_REDIS_URL, else 127.0.0.1:6379 when it answers, else an embedded server."""
    url = os.environ.get("TOOLFLEET_TEST_REDIS_URL")
    if url:
        if not _answers(url):
            pytest.fail(f"TOOLFLEET_TEST_REDIS_URL={url} does not answer")
        REDIS_USED.append(f"TOOLFLEET_TEST_REDIS_URL ({redacted_url(url)})")
        yield url
        return
    if _answers("redis://127.0.0.1:6379/0"):
        REDIS_USED.append("the Redis on 127.0.0.1:6379")
        yield "redis://127.0.0.1:6379/0"
        return
    from toolfleet.worker.devtools.embedded_redis import EmbeddedRedis, redis_server_binary

    try:
        server = EmbeddedRedis()
        server.start()
    except Exception as exc:  # pragma: no cover - depends on the machine
        unavailable(f"no Redis for the tests: {exc}")
    REDIS_USED.append(f"the embedded server {redis_server_binary()} at {server.url}")
    yield server.url
    server.stop()


@pytest.fixture(scope="session")
def toolfleet_redis(redis_url: str) -> str:
    """The plugin's fixture (``toolfleet.testing``), on the suite's one Redis (``redis_url``)."""
    return redis_url


@pytest.fixture(scope="session")
def namespace(redis_url: str) -> Iterator[str]:
    """A namespace unique to this test session; every key under it is deleted at the end."""
    ns = f"tftest-{uuid.uuid4().hex[:10]}"
    yield ns
    delete_namespace(redis_url, ns)


def enqueue_raw(r: redis.Redis, ns: str, request: object, queue: str = TEST_QUEUE) -> str:
    """Enqueue a Dramatiq message by hand, as no producer would, and return its Redis id.

    Args:
        r: the Redis of the fleet.
        ns: the fleet's namespace.
        request: the message's one argument: a ``str`` as is, anything else JSON-encoded
            by the standard library (lone surrogates become ``\\udXXX`` escapes).
        queue: the queue to push it to.
    """
    redis_id = str(uuid.uuid4())
    message = {
        "queue_name": queue, "actor_name": actor_name_for(queue),
        "args": [request if isinstance(request, str) else json.dumps(request)], "kwargs": {},
        "options": {"redis_message_id": redis_id}, "message_id": str(uuid.uuid4()),
        "message_timestamp": int(time.time() * 1000),
    }  # fmt: skip
    pipe = r.pipeline(transaction=False)
    pipe.hset(f"{ns}:{queue}.msgs", redis_id, json.dumps(message))
    pipe.rpush(f"{ns}:{queue}", redis_id)
    pipe.execute()
    return redis_id


@pytest.fixture
def counting_server(tmp_path: Path) -> Iterator[Any]:
    """A private redis-server on loopback (a ``private_redis.Server``), so that its
    ``INFO commandstats`` counts are this test's alone (``private_redis.command_counts``)."""
    from private_redis import start_tcp_server  # it imports this module

    started = start_tcp_server(tmp_path)
    try:
        yield started
    finally:
        started.stop()


def delete_namespace(redis_url: str, ns: str) -> None:
    """Delete every key whose name starts with ``ns`` from the Redis at ``redis_url``."""
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=f"{ns}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
def idle_namespace(redis_url: str, namespace: str) -> Iterator[str]:
    """A namespace whose catalog lists IDLE on a queue with a live heartbeat and no consumer."""
    ns = f"{namespace}-idle-{uuid.uuid4().hex[:6]}"
    r = redis.Redis.from_url(redis_url)
    entry = {"name": IDLE, "description": "x", "parameters": {}, "queue": IDLE_QUEUE}
    r.hset(catalog_key(ns), IDLE, codec.dumps(entry))
    r.zadd(workers_key(ns, IDLE_QUEUE), {"test:0": time.time() + 3600})
    yield ns
    keys = list(r.scan_iter(match=f"{ns}*", count=1000))
    if keys:
        r.delete(*keys)
    r.close()


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@dataclass
class Fleet:
    """A running ``toolfleet worker`` subprocess."""

    process: subprocess.Popen[bytes]
    redis_url: str
    namespace: str
    log_path: Path
    processes: int

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def worker_pids(self) -> list[int]:
        """The live worker processes: the supervisor's children running the worker module."""
        out = subprocess.run(
            [
                "pgrep",
                "-P",
                str(self.process.pid),
                "-f",
                "toolfleet.worker.supervision.worker_process",
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        return [int(p) for p in out.stdout.split()]

    def live_workers(self, queue: str = TEST_QUEUE) -> int:
        client = redis.Redis.from_url(self.redis_url)
        try:
            return int(client.zcount(workers_key(self.namespace, queue), time.time() - 3, "+inf"))
        finally:
            client.close()

    def wait_ready(
        self, count: int | None = None, timeout_s: float = 60.0, queue: str = TEST_QUEUE
    ) -> None:
        want = self.processes if count is None else count
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"toolfleet worker exited:\n{self.log()}")
            if len(self.worker_pids()) >= want and self.live_workers(queue) >= want:
                return
            time.sleep(0.1)
        raise AssertionError(f"workers not ready in {timeout_s} s:\n{self.log()}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


def toolfleet_command() -> str:
    """The installed ``toolfleet`` console script (the real CLI)."""
    script = Path(sys.executable).parent / "toolfleet"
    if not script.exists():
        pytest.fail(f"{script} not found: install the project (pip install -e '.[dev]')")
    return str(script)


def start_fleet(
    redis_url: str,
    namespace: str,
    log_path: Path,
    *,
    processes: int = 2,
    threads: int = 4,
    extra: list[str] | None = None,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    ready_queue: str = TEST_QUEUE,
) -> Fleet:
    """Start ``toolfleet worker`` (the real CLI) with the test extension loaded.

    Returns once every process beats on ``ready_queue``.
    """
    full_env = {
        **os.environ,
        "PYTHONPATH": str(TESTS),
        "TOOLFLEET_REDIS_URL": redis_url,
        "TOOLFLEET_NAMESPACE": namespace,
        "TOOLFLEET_HEARTBEAT_INTERVAL_S": "0.5",
        "TOOLFLEET_WORKER_TTL_S": "3",
        "TOOLFLEET_SHUTDOWN_GRACE_S": "5",
        "TOOLFLEET_HEALTH_DIR": str(log_path.parent / f"health-{uuid.uuid4().hex[:6]}"),
        "TOOLFLEET_METRICS_PORT": "0",
        **(env or {}),
    }
    argv = [
        toolfleet_command(),
        "worker",
        "-p",
        str(processes),
        "-t",
        str(threads),
        "--extension",
        "fleet_tools:extension",
        *(extra or []),
    ]
    log = log_path.open("wb")
    process = subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=cwd)
    fleet = Fleet(process, redis_url, namespace, log_path, processes)
    fleet.wait_ready(queue=ready_queue)
    return fleet


@pytest.fixture(scope="module")
def fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """Two worker processes serving the test extension and the built-in ones."""
    ns = f"{namespace}-{uuid.uuid4().hex[:6]}"
    running = start_fleet(redis_url, ns, tmp_path_factory.mktemp("fleet") / "worker.log")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def small_fleet(
    redis_url: str, namespace: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    """One worker process with two threads, serving the guarantee and promise tools."""
    ns = f"{namespace}-g-{uuid.uuid4().hex[:6]}"
    extra = ["--extension", "guarantee_tools:extension", "--extension", "promise_tools:extension"]
    running = start_fleet(redis_url, ns, tmp_path_factory.mktemp("g") / "worker.log",
                          processes=1, threads=2, extra=extra)  # fmt: skip
    yield running
    running.stop()


@pytest.fixture
def client(fleet: Fleet) -> Iterator[object]:
    from toolfleet.producer import ToolClient

    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as c:
        yield c


# -- both clients, one facade --------------------------------------------------------------

KINDS = ["sync", "async"]


class Either:
    """A ``ToolClient`` or an ``AsyncToolClient`` behind the same blocking methods."""

    def __init__(self, kind: str, *args: Any, **kwargs: Any) -> None:
        self.kind = kind
        self._loop: asyncio.AbstractEventLoop | None = None
        if kind == "sync":
            self.client: Any = ToolClient(*args, **kwargs)
            return
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, daemon=True)
        self._thread.start()
        self.client = AsyncToolClient(*args, **kwargs)

    def _do(self, value: Any, timeout_s: float = 60.0) -> Any:
        if self._loop is None:
            return value
        return asyncio.run_coroutine_threadsafe(value, self._loop).result(timeout_s)

    def submit(self, function: str, arguments: Any = None, **options: Any) -> Any:
        return self._do(self.client.submit(function, arguments, **options))

    def call(self, function: str, arguments: Any = None, **options: Any) -> ToolCallResult:
        return self._do(self.client.call(function, arguments, **options))  # type: ignore[no-any-return]

    def dispatch(self, tool_calls: Any, **options: Any) -> list[dict[str, Any]]:
        return self._do(self.client.dispatch(tool_calls, **options))  # type: ignore[no-any-return]

    def stream(
        self, tool_calls: Any, stop: Callable[[CallEvent], bool] | None = None, **options: Any
    ) -> tuple[list[CallEvent], list[dict[str, Any]]]:
        """Iterate ``client.stream(...)``, leaving it after the first event ``stop`` accepts:
        the events seen and the stream's ``messages`` (none if it was left early)."""
        seen: list[CallEvent] = []

        def leave(event: CallEvent) -> bool:
            seen.append(event)
            return stop is not None and stop(event)

        if self._loop is None:
            with self.client.stream(tool_calls, **options) as events:
                if not any(leave(event) for event in events):
                    return seen, events.messages
            return seen, []

        async def run() -> list[dict[str, Any]]:
            async with self.client.stream(tool_calls, **options) as events:
                async for event in events:
                    if leave(event):
                        return []
            return events.messages  # type: ignore[no-any-return]

        return seen, self._do(run())

    def cancel(self, call_id: str) -> bool:
        return bool(self._do(self.client.cancel(call_id)))

    def tools(self, **options: Any) -> list[dict[str, Any]]:
        return self._do(self.client.tools(**options))  # type: ignore[no-any-return]

    def close(self, wait: bool = True) -> None:
        self._do(self.client.close(wait=wait))

    def result(self, future: Any, timeout_s: float = 60.0) -> ToolCallResult:
        if self._loop is None:
            return future.result(timeout_s)  # type: ignore[no-any-return]

        async def wait() -> ToolCallResult:
            return await asyncio.shield(future)  # type: ignore[no-any-return]

        return self._do(wait(), timeout_s)  # type: ignore[no-any-return]

    def when_done(self, future: Any, callback: Callable[[Any], object]) -> None:
        if self._loop is None:
            future.add_done_callback(callback)
        else:
            self._loop.call_soon_threadsafe(future.add_done_callback, callback)

    @property
    def thread(self) -> int:
        """The thread ``on_event`` callbacks run on: the caller's (sync), the loop's (async)."""
        return threading.get_ident() if self._loop is None else self._thread.ident or 0

    @property
    def in_flight(self) -> int:
        return int(self.client.in_flight)

    def stop(self) -> None:
        """Close the client (if open) and its loop."""
        self.close()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """Each test runs with the sync client and with the async one."""
    return str(request.param)


@pytest.fixture
def make(kind: str) -> Iterator[Callable[..., Either]]:
    """Build clients of this test's kind; all are closed at the end."""
    made: list[Either] = []

    def build(*args: Any, **kwargs: Any) -> Either:
        made.append(Either(kind, *args, **kwargs))
        return made[-1]

    yield build
    for either in made:
        either.stop()


@pytest.fixture
def either(fleet: Fleet, make: Callable[..., Either]) -> Either:
    """A client of each kind (the test runs twice) on ``fleet``."""
    return make(fleet.redis_url, namespace=fleet.namespace)
