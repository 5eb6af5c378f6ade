"""The toolfleet CLI: call, tools, replay, demo (each run as a real subprocess)."""

from __future__ import annotations

import json
import os
import re
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
    assert re.search(r"^ *32  correct ", stdout, re.M) and "mismatched" in stdout, stdout
    assert own_redis, "the demo's embedded redis-server was never seen"
    assert workers, "the demo's worker processes were never seen"
    assert not all_gone(workers, within_s=5.0)
    assert not own_redis & _redis_server_pids()


def test_demo_without_bubblewrap_says_so_in_one_plain_sentence(tmp_path: Path) -> None:
    """On a host without `bwrap`, `toolfleet demo` (2 worker processes) still passes, and
    says once, in a sentence of its own under its first line (no log record: no time, no
    level, no logger), that the python tool is not served and what to install."""
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
    assert about == [
        "The python tool is not served: it needs bubblewrap (apt-get install bubblewrap)."
    ], text
    assert out.stdout.splitlines()[1] == about[0], text
    assert "WARNING" not in text and "ERROR" not in text and "toolfleet.worker" not in text


def test_demo_report_fits_80_columns_and_two_screens() -> None:
    """`toolfleet demo` at 80 columns: every line fits, nothing wrapped or cut (each row
    whole on its line), at most 50 lines; each figure says on its line what it means, the
    quality report lists the tools without their shared `ext_bfcl_`, and the last line is
    the next command to try."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLFLEET_")}
    env |= {"COLUMNS": "80", "TOOLFLEET_NAMESPACE": f"tfdemo-{uuid.uuid4().hex[:8]}"}
    out = subprocess.run([toolfleet_command(), "demo"], capture_output=True, text=True,
                         env=env, timeout=300, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line.rstrip() for line in out.stdout.splitlines()]
    shown = "\n".join(lines)
    assert len(lines) <= 50 and max(map(len, lines)) <= 80, shown
    assert "…" not in shown, shown
    assert lines[0].startswith("toolfleet demo: embedded Redis, 2 worker processes, 32 calls")
    figures = {  # the bundled sample's 32 calls: figure -> its value
        "correct": "32", "bit-exact": "19", "mismatched": "0", "ok": "19",
        "invalid_arguments": "7", "tool_error": "3", "unknown_function": "3",
    }  # fmt: skip
    for figure, value in figures.items():
        line = [row for row in lines if re.match(rf" *{value}  +{figure}  +\w+", row)]
        assert len(line) == 1 and len(line[0].split()) >= 6, (figure, shown)  # with a meaning
    for percentile in ("p50", "p99"):
        assert re.search(rf"^ *\d+ ms  +{percentile}  +\S+ \S+ \S+", shown, re.M), shown
    assert re.search(r"  bit-exact  +of 19 results checked: identical", shown), shown
    rows = [  # the pairs with a call not ok, each on one line, worst first
        "math_factorial          demo/model-b  6 of 8  5 invalid_arguments, 1 tool_error",
        "get_fibonacci_sequence  demo/model-a  1 of 2  1 tool_error",
    ]
    at = [lines.index(row) for row in rows]
    assert at[1] == at[0] + 1 and "tool (after ext_bfcl_)" in lines[at[0] - 1], shown
    assert "ext_bfcl_math_gdc" in shown and "not_a_tool" in shown
    assert lines[-1].startswith("Next: `toolfleet new ") and lines[-2] == "", shown


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
    figures = {  # the replay's figure -> its value, from the lines "<value>  <figure>  ..."
        found[2]: found[1]
        for line in out.stdout.splitlines()
        if (found := re.match(r" *(\d+)  +(\S+)  ", line))
    }
    assert "338 calls replayed from " in out.stdout and "(200 entries)" in out.stdout
    assert (figures["correct"], figures["mismatched"]) == ("338", "0"), out.stdout
    assert figures["unknown_function"] == "132"
    assert figures["ok"] == "202"
    assert figures["tool_error"] == "4"


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


def test_tools_display_is_text_per_tool_with_the_types_of_optional_parameters(
    fleet: Fleet,
) -> None:
    """`toolfleet tools --format display` prints a block of indented lines per tool that
    fit the terminal, each parameter with its type and whether it is required; optional
    parameters keep their types; a description is not repeated as a display one."""
    out = _run(["tools", "--format", "display"], fleet, COLUMNS="80")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) > 100 and max(map(len, lines)) <= 80, out.stdout[:2000]
    blocks: dict[str, str] = {}
    for line in lines:  # a tool's block starts with its name, unindented
        if line and not line.startswith(" "):
            name = line
        blocks[name] = blocks.get(name, "") + line + "\n"
    book = blocks["ext_bfcl_book_room"]
    assert "    discount_code (string, optional): The discount code (if any)." in book
    assert "    room_type (string, required): The room type to book." in book
    assert "  Book a room for a customer and return the booking." in book
    assert "    timezone (string, optional): IANA time zone" in blocks["ext_date_calculator_now"]
    assert "shown as:" not in out.stdout  # the bundled tools have no display text of their own
    assert "(null," not in out.stdout and "(None," not in out.stdout
