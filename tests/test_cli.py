"""The toolfleet CLI: call, tools, replay, demo (each run as a real subprocess)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from conftest import Fleet, bfcl_file, toolfleet_command
from proctree import all_gone, cmdline, descendants
from toolfleet.worker.devtools.embedded_redis import redis_server_binary


def _run(
    args: list[str], fleet: Fleet | None = None, timeout: float = 300, **env: str
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": os.path.dirname(__file__), **env}
    if fleet is not None:
        full_env.update(TOOLFLEET_REDIS_URL=fleet.redis_url, TOOLFLEET_NAMESPACE=fleet.namespace)
    return subprocess.run(
        [toolfleet_command(), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )


def _workers_of(pid: int) -> set[int]:
    """The live worker processes below ``pid`` (their command lines hold no namespace)."""
    return {
        p for p in descendants(pid) if "toolfleet.worker.supervision.worker_process" in cmdline(p)
    }


def _children(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True, check=False)
    return {int(p) for p in out.stdout.split()}


def _redis_server_pids() -> set[int]:
    """Processes named like the embedded server binary (valkey-server or redis-server)."""
    name = Path(redis_server_binary()).name
    out = subprocess.run(["pgrep", name], capture_output=True, text=True, check=False)
    return {int(p) for p in out.stdout.split()}


def test_version_prints_the_projects_version() -> None:
    """``toolfleet --version`` prints ``toolfleet <version>`` (pyproject.toml's) and exits 0,
    with no Redis."""
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    done = _run(["--version"], TOOLFLEET_REDIS_URL="redis://127.0.0.1:1/0", timeout=60)
    assert (done.returncode, done.stderr) == (0, ""), done.stdout + done.stderr
    assert done.stdout == f"toolfleet {project['project']['version']}\n"


def test_call_exits_zero_only_for_ok(fleet: Fleet) -> None:
    """`toolfleet call` prints the result and exits 0 for ok, 1 otherwise."""
    ok = _run(["call", "ext_fleet_test_add", '{"a": 2, "b": 3}'], fleet)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["content"] == 5
    bad = _run(["call", "ext_fleet_test_add", '{"a": 2'], fleet)
    assert bad.returncode == 1
    assert json.loads(bad.stdout)["status"] == "invalid_arguments"


def test_tools_lists_openai_functions(fleet: Fleet) -> None:
    """`toolfleet tools` prints the catalog in OpenAI chat-completions format."""
    out = _run(["tools"], fleet)
    assert out.returncode == 0, out.stderr
    names = {t["function"]["name"] for t in json.loads(out.stdout)}
    assert {"ext_fleet_test_add", "ext_bfcl_math_factorial", "ext_bfcl_maxPoints"} <= names


def test_commands_needing_redis_say_so_without_a_url() -> None:
    """Without a Redis URL, worker/call explain what is missing instead of crashing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    out = subprocess.run(
        [toolfleet_command(), "call", "f", "{}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "TOOLFLEET_REDIS_URL" in out.stderr


def test_replay_exits_one_on_mismatch(fleet: Fleet, tmp_path: object) -> None:
    """`toolfleet replay` exits 1 when any call does not match its expectation."""
    path = os.path.join(str(tmp_path), "calls.jsonl")
    with open(path, "w") as f:
        f.write(
            json.dumps(
                {
                    "function": "ext_fleet_test_add",
                    "arguments": {"a": 1, "b": 1},
                    "expect_content": 3,
                }
            )
            + "\n"
        )
        f.write(
            json.dumps(
                {
                    "function": "ext_fleet_test_add",
                    "arguments": {"a": 1, "b": 1},
                    "expect_content": 2,
                }
            )
            + "\n"
        )
    out = _run(["replay", path], fleet)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "mismatch" in out.stdout


def test_demo_on_embedded_redis_prints_table_and_leaves_nothing_behind() -> None:
    """`toolfleet demo` with no Redis URL starts an embedded Redis and a fleet, replays the
    bundled sample, exits 0 and leaves no process behind."""
    namespace = f"tfdemo-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["TOOLFLEET_NAMESPACE"] = namespace
    process = subprocess.Popen(
        [toolfleet_command(), "demo"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    own_redis: set[int] = set()
    workers: set[int] = set()
    while process.poll() is None:  # note the demo's own redis-server and workers while it runs
        own_redis |= _redis_server_pids() & _children(process.pid)
        workers |= _workers_of(process.pid)
        time.sleep(0.02)
    stdout = process.stdout.read() if process.stdout else ""
    assert process.returncode == 0, stdout
    assert "embedded Redis" in stdout
    assert "mismatched" in stdout and "32 │" in stdout
    assert own_redis, "the demo's embedded redis-server was never seen"
    assert workers, "the demo's worker processes were never seen"
    assert not all_gone(workers, within_s=5.0)
    assert not own_redis & _redis_server_pids()


def test_demo_without_bubblewrap_says_so_in_one_warning_line(tmp_path: Path) -> None:
    """On a host without `bwrap`, `toolfleet demo` (2 worker processes) still passes, and
    says once, as a warning and not an error, that the python tool is not served and why."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["TOOLFLEET_NAMESPACE"] = f"tfdemo-{uuid.uuid4().hex[:8]}"
    env["PATH"] = str(tmp_path)  # an empty folder: no bwrap to be found
    out = subprocess.run(
        [toolfleet_command(), "demo"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    text = out.stdout + out.stderr
    assert out.returncode == 0, text
    assert "mismatched" in text
    about = [line for line in text.splitlines() if "bubblewrap" in line]
    assert len(about) == 1, text
    assert " WARNING " in about[0] and "python" in about[0] and "not served" in about[0]
    assert " ERROR " not in text, text


def test_demo_replays_bfcl_exec_files() -> None:
    """All offline BFCL exec calls come back correct, network calls unknown_function."""
    files = [bfcl_file(f"BFCL_v3_exec_{c}.json") for c in ("simple", "multiple", "parallel")]
    bfcl_file("derived", "BFCL_v3_exec_expected_results.jsonl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    out = subprocess.run(
        [toolfleet_command(), "demo", *map(str, files)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    rows = {
        line.split("│")[1].strip(): line for line in out.stdout.splitlines() if line.count("│") == 3
    }
    summary = [line.split("│")[1:-1] for line in out.stdout.splitlines() if line.count("│") == 8]
    entries, calls, correct, _exact, mismatched = (int(c) for c in summary[0][:5])
    assert (entries, calls, correct, mismatched) == (200, 338, 338, 0)
    assert rows["unknown_function"].split("│")[2].strip() == "132"
    assert rows["ok"].split("│")[2].strip() == "202"
    assert rows["tool_error"].split("│")[2].strip() == "4"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_demo_stopped_by_a_signal_leaves_nothing_behind(signum: int) -> None:
    """A demo ended by SIGTERM, SIGHUP or Ctrl-C stops its workers and its embedded Redis."""
    namespace = f"tfdemo-{uuid.uuid4().hex[:8]}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env["TOOLFLEET_NAMESPACE"] = namespace
    slow = Path(__file__).parent / "slow_demo.jsonl"
    process = subprocess.Popen(
        [toolfleet_command(), "demo", str(slow)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(_workers_of(process.pid)) < 2:
        time.sleep(0.05)
    workers = _workers_of(process.pid)
    assert workers, "the demo's workers never started"
    own_redis = _redis_server_pids() & _children(process.pid)
    assert len(own_redis) == 1, "the demo's embedded redis-server was not found"
    process.send_signal(signum)
    process.wait(timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and own_redis & _redis_server_pids():
        time.sleep(0.1)
    assert not all_gone(workers, within_s=max(0.0, deadline - time.monotonic()))
    assert not own_redis & _redis_server_pids()


def test_tools_with_no_worker_prints_an_empty_list_and_says_why_on_stderr(
    redis_url: str, namespace: str
) -> None:
    """With no worker, `toolfleet tools` prints `[]` alone on stdout (still JSON) and a line
    on stderr saying that no worker has published tools, or that the catalogued ones have no
    live worker (pointing to --all)."""
    import redis

    from toolfleet.shared import codec
    from toolfleet.shared.naming import catalog_key

    ns = f"{namespace}-notools-{uuid.uuid4().hex[:6]}"
    env = {"TOOLFLEET_REDIS_URL": redis_url, "TOOLFLEET_NAMESPACE": ns}
    empty = _run(["tools"], **env)
    assert empty.returncode == 0, empty.stderr
    assert json.loads(empty.stdout) == []
    assert "no worker has published any" in empty.stderr and "toolfleet worker" in empty.stderr
    assert repr(ns) in empty.stderr
    client = redis.Redis.from_url(redis_url)
    try:
        entry = {"name": "ext_gone_f", "description": "x", "parameters": {}, "queue": "tools.gone"}
        client.hset(catalog_key(ns), "ext_gone_f", codec.dumps(entry))  # no worker serves it
        unserved = _run(["tools"], **env)
        assert json.loads(unserved.stdout) == [], unserved.stdout
        assert "1 catalogued" in unserved.stderr and "--all" in unserved.stderr, unserved.stderr
        listed = _run(["tools", "--all"], **env)
        assert [t["function"]["name"] for t in json.loads(listed.stdout)] == ["ext_gone_f"]
        assert listed.stderr == ""
    finally:
        client.delete(catalog_key(ns))
        client.close()
