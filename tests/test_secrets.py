"""Fleet secrets stay out of command lines and out of reach of model-written code.

A fleet runs against its own password-protected ``redis-server`` (on a private port) with
an extension secret setting planted in its environment and a file holding both secrets
in the worker's working directory.
"""

from __future__ import annotations

import ast
import os
import secrets
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from guarded_ext import SECRET_ENV

from conftest import TESTS, Fleet, start_fleet, toolfleet_command, unavailable
from proctree import cmdline, tree
from toolfleet.extensions.python import PythonToolConfig, make_extension
from toolfleet.extensions.python._sandbox import unavailable_reason
from toolfleet.producer import ToolClient
from toolfleet.shared.errors import ConfigurationError
from toolfleet.shared.wire import Status
from toolfleet.worker.devtools.embedded_redis import redis_server_binary

#: The same tool without a boundary, loaded by the fleet as a positive control: the scan
#: below must find the secrets from there, or it proves nothing.
unsafe_extension = make_extension(PythonToolConfig(isolation="unsafe-none"), slug="python-unsafe")

LIFELINE_EXT = TESTS / "lifeline_ext"

#: Scans every /proc/*/cmdline and /proc/*/environ it can read, its own environment, and
#: every file under WORKER_CWD, for the (reversed, so that the code does not hold them)
#: NEEDLES; its result is the list of needles found and how many sources were read.
SCAN = """
import glob, os
needles = [n[::-1] for n in NEEDLES]
blobs = []
for pattern in ("/proc/*/cmdline", "/proc/*/environ"):
    for path in glob.glob(pattern):
        try:
            blobs.append(open(path, "rb").read())
        except OSError:
            pass
blobs.append(repr(dict(os.environ)).encode())
for root, _, files in os.walk(WORKER_CWD):
    for name in files:
        try:
            blobs.append(open(os.path.join(root, name), "rb").read())
        except OSError:
            pass
data = b"\\n".join(blobs)
([n[:3] for n in needles if n.encode() in data], len(blobs))
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def password() -> str:
    return "pw-" + secrets.token_hex(12)


@pytest.fixture(scope="module")
def protected_redis(password: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private Redis server that requires ``password``; yields its URL (password included)."""
    try:
        server = redis_server_binary()
    except ConfigurationError as exc:
        unavailable(str(exc))
    port = _free_port()
    folder = tmp_path_factory.mktemp("protected-redis")
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    url = f"redis://:{password}@127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                client = redis.Redis.from_url(f"redis://127.0.0.1:{port}/0")
                client.config_set("requirepass", password)  # not on redis-server's own argv
                client.close()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def secret_fleet(
    protected_redis: str, tmp_path_factory: pytest.TempPathFactory, password: str
) -> Iterator[tuple[Fleet, str, Path]]:
    """Two worker processes (thread, process and python tools) holding two secrets."""
    planted = "planted-" + secrets.token_hex(12)
    cwd = tmp_path_factory.mktemp("worker-cwd")
    (cwd / "worker-notes.txt").write_text(f"{protected_redis}\n{SECRET_ENV}={planted}\n")
    pythonpath = os.pathsep.join([str(TESTS), str(LIFELINE_EXT)])
    fleet = start_fleet(
        protected_redis,
        f"tfsecret-{uuid.uuid4().hex[:8]}",
        tmp_path_factory.mktemp("secret-fleet") / "worker.log",
        processes=2,
        threads=2,
        extra=[
            "--extension",
            "guarded_ext:extension",
            "--extension",
            "lifeline_tools:extension",
            "--extension",
            "test_secrets:unsafe_extension",
        ],
        env={SECRET_ENV: planted, "PYTHONPATH": pythonpath},
        cwd=cwd,
    )
    yield fleet, planted, cwd
    fleet.stop()


def _scan(client: ToolClient, function: str, needles: list[str], cwd: Path) -> Any:
    code = f"NEEDLES = {[n[::-1] for n in needles]!r}\nWORKER_CWD = {str(cwd)!r}\n{SCAN}"
    result = client.call(function, {"code": code}, timeout_s=60)
    assert result.status is Status.OK, result
    assert result.content["error"] is None, result.content["error"]
    return ast.literal_eval(result.content["result"])


def _require_sandbox() -> None:
    reason = unavailable_reason(PythonToolConfig())
    if reason:
        unavailable(reason)


def test_no_fleet_process_has_a_secret_in_its_command_line(
    secret_fleet: tuple[Fleet, str, Path], password: str
) -> None:
    """No process of a running fleet (workers, tool children, sandboxes) has a secret in argv."""
    fleet, planted, cwd = secret_fleet
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        child = client.call("ext_lifeline_hold_gil_in_child", {"marker": "/dev/null"}, timeout_s=1)
        assert child.status is Status.TIMEOUT  # a process-isolation child was at work
        if unavailable_reason(PythonToolConfig()) is None:
            kept = client.call("ext_python_run", {"code": "1"}, context={"conversation": "c"})
            assert kept.status is Status.OK
        kept = client.call("ext_python_unsafe_run", {"code": "1"}, context={"conversation": "c"})
        assert kept.status is Status.OK  # the interpreter of a conversation stays alive
        pids = tree(fleet.process.pid)
    lines = {pid: cmdline(pid) for pid in pids}
    assert (
        len([c for c in lines.values() if "toolfleet.worker.supervision.worker_process" in c]) == 2
    ), lines
    assert any("repl.py" in c for c in lines.values()), lines
    assert any("forkserver" in c for c in lines.values()), lines
    for pid, line in lines.items():
        assert password not in line and planted not in line, f"secret in argv of {pid}: {line}"


def test_sandboxed_code_finds_no_secret(
    secret_fleet: tuple[Fleet, str, Path], password: str
) -> None:
    """Code in ext_python_run scanning /proc, its environment and the worker's cwd finds none."""
    _require_sandbox()
    fleet, planted, cwd = secret_fleet
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        exposed, _ = _scan(client, "ext_python_unsafe_run", [password, planted], cwd)
        found, sources = _scan(client, "ext_python_run", [password, planted], cwd)
    assert sorted(exposed) == sorted([password[:3], planted[:3]]), "the control scan found none"
    assert sources >= 3  # its own /proc entries and environment were read
    assert found == []


def test_sandbox_has_no_network_and_no_other_process(secret_fleet: tuple[Fleet, str, Path]) -> None:
    """Inside the sandbox only its own processes exist and no network interface but loopback."""
    _require_sandbox()
    fleet, _, _ = secret_fleet
    code = (
        "import os, socket\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', PORT), timeout=1).close(); net = 'open'\n"
        "except OSError as exc:\n"
        "    net = type(exc).__name__\n"
        "(len(pids), net)"
    )
    port = int(fleet.redis_url.rsplit(":", 1)[1].split("/")[0])
    with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
        result = client.call("ext_python_run", {"code": code.replace("PORT", str(port))})
        control = client.call("ext_python_unsafe_run", {"code": code.replace("PORT", str(port))})
    assert result.status is Status.OK and result.content["error"] is None, result
    count, net = ast.literal_eval(result.content["result"])
    assert count <= 3 and net == "ConnectionRefusedError"  # bwrap's init, python, no Redis
    _, control_net = ast.literal_eval(control.content["result"])
    assert control_net == "open"


def test_python_tool_is_refused_and_reported_without_isolation(
    redis_url: str, namespace: str, tmp_path: Path
) -> None:
    """Without bubblewrap the fleet does not serve ext_python_run: the catalog does not list
    it, the fleet's extension errors and extensions check say why, and its two worker
    processes say so in one warning line, not an error."""
    no_bwrap = {"PATH": str(tmp_path)}  # an empty folder: no bwrap to be found
    fleet = start_fleet(
        redis_url, f"{namespace}-nobwrap-{uuid.uuid4().hex[:6]}", tmp_path / "w.log", env=no_bwrap
    )
    try:
        with ToolClient(fleet.redis_url, namespace=fleet.namespace) as client:
            assert client.call("ext_fleet_test_add", {"a": 1, "b": 2}).content == 3
            refused = client.call("ext_python_run", {"code": "1"})
            listed = {t["function"]["name"] for t in client.tools(include_unavailable=True)}
            reported = client.extension_errors()
        assert refused.status is Status.UNKNOWN_FUNCTION, refused
        assert "ext_fleet_test_add" in listed and "ext_python_run" not in listed
        why = " ".join(v for k, v in reported.items() if k.startswith("entry point python "))
        assert "bubblewrap" in why and "apt-get install bubblewrap" in why, reported
        check = subprocess.run(
            [toolfleet_command(), "extensions", "check"],
            capture_output=True,
            text=True,
            env={
                **os.environ,
                **no_bwrap,
                "TOOLFLEET_REDIS_URL": fleet.redis_url,
                "TOOLFLEET_NAMESPACE": fleet.namespace,
            },
            timeout=120,
            check=False,
        )
    finally:
        fleet.stop()
    assert check.returncode == 1
    text = " ".join(check.stdout.split())  # the console wraps long lines
    assert "problem entry point python" in text and "bubblewrap" in text, check.stdout
    assert "problem worker: entry point python" in text, check.stdout
    log = (tmp_path / "w.log").read_text()
    said = [line for line in log.splitlines() if "bubblewrap" in line]
    assert len(said) == 1 and " WARNING " in said[0], log
    assert " ERROR " not in log, log
