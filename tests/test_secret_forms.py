"""A fleet's secrets stay in, whatever form a tool gives them and wherever it writes them.

One worker process on a private password-protected ``redis-server`` serves
``tests/leaky_ext.py`` (a non-ASCII secret setting) and two MCP extensions, one of which
puts a secret setting in its server's ``args``.
"""

from __future__ import annotations

import json
import secrets
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from leaky_ext import SECRET_ENV

from conftest import TESTS, Fleet, start_fleet
from private_redis import Server, start_tcp_server
from toolfleet.producer import ToolClient
from toolfleet.shared import codec
from toolfleet.shared.naming import events_key, extension_errors_key, outcome_key
from toolfleet.shared.wire import Status

PROBE = TESTS / "mcp_servers" / "probe_server.py"
#: The tool's secret: non-ASCII, so that its bytes repr differs from every form of the text.
SECRET = f"clé-secrète-密钥-{secrets.token_hex(6)}"
#: The secret setting the argvleak MCP extension puts in its server's args.
ARGV_SECRET = f"argv-{secrets.token_hex(12)}"


def _bytes_forms(secret: str) -> set[str]:
    """The body of ``repr(secret.encode())`` as a tool writes it, and JSON-escaped (as a reply,
    an outcome or an event holds it); computed here, independently of the redactor."""
    body = "".join(f"\\x{b:02x}" if b > 0x7E else chr(b) for b in secret.encode())
    return {body, body.replace("\\", "\\\\")}


def _text_forms(secret: str) -> set[str]:
    """The secret raw and as ``repr``/JSON write it (computed independently of the redactor)."""
    return {secret, json.dumps(secret)[1:-1], repr(secret)[1:-1], *_bytes_forms(secret)}


def _wait_for(check: Callable[[], Any], timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _mcp_manifest(folder: Path, slug: str, marks: Path, where: str) -> None:
    """A probe-server extension whose secret ``token`` goes to the server by ``where``."""
    if where == "args":  # the secret becomes a folder name on the server's command line
        passing = f"args = {json.dumps([str(PROBE), '--marks', str(marks / '{settings.token}')])}"
    else:
        passing = (
            f"args = {json.dumps([str(PROBE), '--marks', str(marks)])}\n"
            'env = { PROBE_TOKEN = "{settings.token}" }'
        )
    (folder / slug).mkdir(parents=True)
    (folder / slug / "extension.toml").write_text(
        f'slug = "{slug}"\nversion = "1.0.0"\n[mcp]\ncommand = {json.dumps(sys.executable)}\n'
        f'{passing}\n[[settings]]\nname = "token"\nsecret = true\n',
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def password() -> str:
    return "pw-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def protected_redis(password: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private redis-server on a free port that requires ``password``; yields its URL."""
    server: Server = start_tcp_server(tmp_path_factory.mktemp("protected"))
    try:
        redis.Redis.from_url(server.url).config_set("requirepass", password)
        yield server.url.replace("redis://", f"redis://:{password}@")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def leaky_fleet(protected_redis: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """One worker process serving the leaky tools and the two MCP extensions."""
    tmp = tmp_path_factory.mktemp("leaky")
    folder, marks = tmp / "extensions", tmp / "marks"
    _mcp_manifest(folder, "argvleak", marks, "args")
    _mcp_manifest(folder, "envok", marks, "env")
    fleet = start_fleet(
        protected_redis,
        f"tfleaky-{uuid.uuid4().hex[:8]}",
        tmp / "worker.log",
        processes=1,
        threads=2,
        extra=["--extension", "leaky_ext:extension"],
        env={
            SECRET_ENV: SECRET,
            "TOOLFLEET_EXTENSION_PATHS": str(folder),
            "TOOLFLEET_EXT_ARGVLEAK_TOKEN": ARGV_SECRET,
            "TOOLFLEET_EXT_ENVOK_TOKEN": f"env-{secrets.token_hex(12)}",
        },
    )
    yield fleet
    fleet.stop()


@pytest.fixture
def leaky_client(leaky_fleet: Fleet) -> Iterator[ToolClient]:
    with ToolClient(leaky_fleet.redis_url, namespace=leaky_fleet.namespace) as client:
        yield client


def _all_cmdlines() -> str:
    """Every readable /proc/<pid>/cmdline of the machine, as one text."""
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            found.append(path.read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(found)


def test_a_secret_setting_in_mcp_args_is_refused_and_never_reaches_a_command_line(
    leaky_fleet: Fleet, leaky_client: ToolClient
) -> None:
    """An MCP extension whose args name a secret setting is skipped and reported with a
    message pointing to env; no process has the secret in its argv; the others serve."""
    pytest.importorskip("mcp", reason="the MCP SDK (toolfleet[mcp]) is not installed")
    assert leaky_client.call("ext_fleet_test_add", {"a": 1, "b": 2}).content == 3
    echoed = leaky_client.call("ext_envok_echo", {"text": "hi"}, timeout_s=20)
    assert echoed.status is Status.OK and echoed.content == {"result": "hi"}, (
        echoed
    )  # env is the way
    assert ARGV_SECRET not in _all_cmdlines()
    client = redis.Redis.from_url(leaky_fleet.redis_url)
    try:

        def reported() -> list[str]:
            raw = client.hgetall(extension_errors_key(leaky_fleet.namespace))
            errors = [e for r in raw.values() for e in json.loads(r)["errors"].values()]
            return [e for e in errors if "argvleak" in e]

        problems = _wait_for(reported, 10, "the argvleak extension is reported")
    finally:
        client.close()
    assert "secret" in problems[0] and "env" in problems[0], problems
    assert "/proc/<pid>/cmdline" in problems[0], problems
    assert leaky_client.call("ext_argvleak_echo", {"text": "hi"}).status is Status.UNKNOWN_FUNCTION


def test_the_bytes_repr_of_a_secret_reaches_no_reply_outcome_event_or_log(
    leaky_fleet: Fleet, leaky_client: ToolClient
) -> None:
    """A tool returning, logging and reporting f"{secret.encode()!r}" (and crashing with it)
    leaves that form in neither the reply, the recorded outcome, the events stream nor the log."""
    result = leaky_client.call("ext_leaky_bytes_form", {})
    crashed = leaky_client.call("ext_leaky_bytes_crash", {})
    assert result.status is Status.OK, result
    assert crashed.status is Status.CRASHED, crashed
    assert result.content["bytes"] == "b'[redacted]'", result.content
    client = redis.Redis.from_url(leaky_fleet.redis_url)
    try:
        outcome = client.get(outcome_key(leaky_fleet.namespace, result.id))
        entries = client.xrange(events_key(leaky_fleet.namespace))
    finally:
        client.close()
    assert outcome is not None and result.id.encode() in outcome
    events = [v.decode() for _, fields in entries for v in fields.values()]
    events = [e for e in events if result.id in e]
    assert events and "[redacted]" in events[0], events  # the result travels in the event
    log = _wait_for(
        lambda: "bytes form: b'[redacted]'" in leaky_fleet.log() and leaky_fleet.log(),
        10,
        "the tool's log line reaches the log",
    )
    texts = {"reply": codec.dumps_str(result.content), "outcome": outcome.decode()}
    texts |= {"events": "\n".join(events), "log": log}
    for form in _bytes_forms(SECRET):
        for where, text in texts.items():
            assert form not in text, (where, form)


def test_what_tools_print_write_to_stderr_or_warn_is_scrubbed(
    leaky_fleet: Fleet, leaky_client: ToolClient
) -> None:
    """print(), sys.stderr.write() and warnings.warn() of a secret, in a worker thread and in
    a process-isolation child, reach the worker's output with the secret redacted."""
    for function in ("ext_leaky_print_leak", "ext_leaky_print_leak_in_child"):
        result = leaky_client.call(function, {}, timeout_s=30)
        assert result.status is Status.OK, result
    markers = [
        f"{what} {tag} [redacted]"
        for what in ("printed", "stderr", "warned")
        for tag in ("thread", "child")
    ]

    def arrived() -> str | None:
        log = leaky_fleet.log()
        return log if all(marker in log for marker in markers) else None

    log = _wait_for(arrived, 10, f"{markers} in the log")
    for form in _text_forms(SECRET):
        assert form not in log, form


def test_a_tool_returning_its_environment_shows_no_redis_password(
    leaky_fleet: Fleet, leaky_client: ToolClient, password: str
) -> None:
    """dict(os.environ) of a worker process or of a tool child comes back with the Redis
    password (in TOOLFLEET_REDIS_URL) redacted."""
    for function in ("ext_leaky_environ", "ext_leaky_environ_in_child"):
        result = leaky_client.call(function, {}, timeout_s=30)
        assert result.status is Status.OK, result
        url = result.content["TOOLFLEET_REDIS_URL"]
        assert url.startswith("redis://:[redacted]@127.0.0.1:"), (function, url)
        assert result.content[SECRET_ENV] == "[redacted]"
        assert password not in codec.dumps_str(result.content), function
    assert password not in leaky_fleet.log()
