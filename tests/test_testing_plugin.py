"""The pytest plugin of toolfleet.testing, as a user meets it: a fresh folder outside the
checkout, plain ``pytest``, an extension of their own, and nothing but the embedded server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import TESTS
from toolfleet.shared import Status
from toolfleet.testing import FleetFactory, run_tool, start_fleet

ROOT = Path(__file__).resolve().parents[1]

USER_TOOLS = '''
from pydantic import BaseModel
from toolfleet.shared import Extension, ExtensionContext, ExtensionToolError, Tool


class ShoutArguments(BaseModel):
    text: str


class Shout(Tool):
    """Shout a text."""

    name = "shout"
    arguments_model = ShoutArguments

    def call(self, arguments: ShoutArguments, context: ExtensionContext) -> str:
        if not arguments.text:
            raise ExtensionToolError("text: must not be empty")
        return arguments.text.upper() + "!"


extension = Extension(slug="shouting", version="1", tools=[Shout])
'''

USER_TEST = """
import os
from pathlib import Path

import redis

from toolfleet.shared import Status
from toolfleet.testing import FleetFactory, run_tool, start_fleet

SEEN = Path(os.environ["USER_TEST_RECORD"])
EXPECTED = "HI!"


def test_run_tool_answers_as_a_worker() -> None:
    assert run_tool("shouting_tools:extension", "shout", {"text": "hi"}).content == EXPECTED
    empty = run_tool("shouting_tools:extension", "shout", '{"text": ""}')
    assert empty.status is Status.TOOL_ERROR
    assert empty.content == {"error": "text: must not be empty"}


def test_a_fleet_serves_the_extension(toolfleet_fleet: FleetFactory, toolfleet_redis: str) -> None:
    fleet = toolfleet_fleet("shouting_tools:extension", processes=1)
    assert fleet.url == toolfleet_redis and fleet.functions == ["ext_shouting_shout"]
    result = fleet.client.call("ext_shouting_shout", {"text": "hi"}, timeout_s=30)
    SEEN.write_text(f"{fleet.namespace} {' '.join(map(str, fleet.pids))}")
    assert result.status is Status.OK
    assert result.content == EXPECTED


def test_the_fleet_left_no_key_behind(toolfleet_redis: str) -> None:
    namespace = SEEN.read_text().split()[0]
    assert list(redis.Redis.from_url(toolfleet_redis).scan_iter(match=namespace + "*")) == []
"""


def _user_folder(tmp_path: Path, expected: str) -> Path:
    folder = tmp_path / "user-project"
    folder.mkdir()
    (folder / "shouting_tools.py").write_text(USER_TOOLS)
    (folder / "test_shouting.py").write_text(USER_TEST.replace('"HI!"', repr(expected)))
    return folder


def _run_pytest(folder: Path, tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path]:
    """Plain ``pytest`` in ``folder`` (the venv's script: the plugin comes from its entry
    point), with no TOOLFLEET_* variable and its own TMPDIR."""
    record = tmp_path / "seen.txt"
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLFLEET_", "PYTHON"))}
    env.update({"USER_TEST_RECORD": str(record), "TMPDIR": str(tmpdir)})
    pytest_script = Path(sys.executable).parent / "pytest"
    out = subprocess.run(
        [str(pytest_script), "-p", "no:cacheprovider", "-q"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    return out, record


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text()


def _processes_under(path: Path) -> list[str]:
    """Command lines of live processes that name ``path`` (the embedded server's socket)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if str(path) in cmdline:
            found.append(cmdline)
    return found


def test_a_users_test_file_passes_outside_the_checkout(tmp_path: Path) -> None:
    """run_tool and the toolfleet_fleet fixture work in a user's folder with plain pytest;
    the fleet's worker processes, its keys and the embedded server are gone afterwards."""
    assert not tmp_path.is_relative_to(ROOT)
    out, record = _run_pytest(_user_folder(tmp_path, "HI!"), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "3 passed" in out.stdout, out.stdout
    pids = [int(p) for p in record.read_text().split()[1:]]
    assert pids, "the fleet reported no worker process"
    deadline = time.monotonic() + 10
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, pids)), pids
    assert _processes_under(tmp_path / "tmp") == []


def test_the_same_file_with_a_wrong_expectation_fails(tmp_path: Path) -> None:
    """A wrong expected value fails both the run_tool test and the fleet test."""
    out, _ = _run_pytest(_user_folder(tmp_path, "HI?"), tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "2 failed, 1 passed" in out.stdout, out.stdout
    assert "AssertionError" in out.stdout and "'HI!' == 'HI?'" in out.stdout, out.stdout


def test_the_projects_own_tests_get_the_fleet_on_the_suites_redis(
    toolfleet_fleet: FleetFactory, toolfleet_redis: str, redis_url: str
) -> None:
    """In this suite, toolfleet_redis is the suite's Redis (conftest), and a fleet serves an
    extension folder and a MODULE:ATTR extension, each queue ready before the factory returns."""
    assert toolfleet_redis == redis_url
    fleet = toolfleet_fleet(TESTS / "run_tool_ext", "ext_styles.styles:class_style")
    assert fleet.functions == [
        "ext_folder_tools_answer",
        "ext_folder_tools_stuck",
        "ext_style_class_greet",
    ]
    answer = fleet.client.call("ext_folder_tools_answer", {}, context={"account": "acme"})
    assert answer.content == {"slug": "folder-tools", "account": "acme"}
    stuck = fleet.client.call("ext_folder_tools_stuck", {}, timeout_s=30)
    assert (stuck.status, stuck.content) == run_tool_answer(TESTS / "run_tool_ext", "stuck")
    assert fleet.client.call("ext_style_class_greet", {"name": "Ada"}).content == "Hello, Ada!"
    fleet.stop()
    fleet.stop()  # idempotent; the factory's teardown stops it once more


def run_tool_answer(source: Path, name: str) -> tuple[Status, object]:
    """What run_tool answers to ``name`` with no arguments: (status, content)."""
    result = run_tool(source, name, {})
    return result.status, result.content


def test_loading_the_plugin_imports_no_toolfleet_code() -> None:
    """pytest loading the plugin (entry point pytest11) imports nothing of toolfleet but
    the plugin, so a suite that uses no fixture of it pays nothing."""
    code = (
        "import sys, importlib.metadata as m\n"
        "(ep,) = [e for e in m.entry_points(group='pytest11') if e.name == 'toolfleet']\n"
        "ep.load()\n"
        "loaded = sorted(n for n in sys.modules if n.startswith('toolfleet'))\n"
        "print(loaded)\n"
        "plugin = ['toolfleet', 'toolfleet.testing', 'toolfleet.testing._types',\n"
        "          'toolfleet.testing.pytest_plugin']\n"
        "sys.exit(loaded != plugin)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_run_tool_needs_no_pytest() -> None:
    """A script without pytest installed imports toolfleet.testing and calls run_tool."""
    code = (
        "import sys\n"
        "sys.modules['pytest'] = None  # as if not installed\n"
        "from toolfleet.testing import FleetFactory, run_tool\n"
        "result = run_tool('queue_names_ext:dash', 'dash', {})\n"
        "sys.exit(result.content != 'a-b')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_start_fleet_refuses_what_it_cannot_start_before_starting_anything(
    toolfleet_redis: str,
) -> None:
    """No extension, an object (it cannot cross into the worker processes) and a spec that
    does not import are refused in the test's process, with the reason."""
    from ext_styles import styles

    with pytest.raises(ValueError, match="name at least one extension"):
        start_fleet(redis_url=toolfleet_redis)
    with pytest.raises(TypeError, match="'module:attr' or a folder path"):
        start_fleet(styles.class_style, redis_url=toolfleet_redis)
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        start_fleet("no_such_module:extension", redis_url=toolfleet_redis)
