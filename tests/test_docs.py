"""The README and the docs site stay true: their code blocks run against a real fleet, the
README fits on a screen and starts with what CI runs, and ``mkdocs build --strict`` passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from doc_blocks import (
    ROOT,
    RUNNABLE,
    Block,
    Run,
    blocks,
    markers_without_block,
    run_blocks,
    worker_command,
    write_files,
)

from conftest import TESTS, Fleet, require_sandbox, start_fleet

README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
MKDOCS = Path(sys.executable).parent / "mkdocs"
KINDS = {"python", "bash", "text", "toml", "json", "yaml"}


def _runnable(page: list[Block]) -> bool:
    return any(
        b.marker not in ("fragment", "file", "output")
        and b.lang in RUNNABLE
        and worker_command(b) is None
        for b in page
    )


def _run_page(path: Path, fleet: Fleet, tmp_path: Path, skip: frozenset[int] = frozenset()) -> int:
    page = blocks(path)
    write_files(page, tmp_path)
    fleets = [command for command in map(worker_command, page) if command is not None]
    if not fleets:
        return run_blocks(page, Run(tmp_path, fleet.redis_url, fleet.namespace), skip=skip)
    assert len(fleets) == 1, f"{path}: one `toolfleet worker` line per page"
    variables, arguments = fleets[0]
    variables.pop("PYTHONPATH", None)  # the page's folder is on it (and the tests' tools)
    own = start_fleet(
        fleet.redis_url,
        f"{fleet.namespace}-doc-{uuid.uuid4().hex[:6]}",
        tmp_path / "worker.log",
        processes=1,
        extra=arguments,
        env={**variables, "PYTHONPATH": f"{TESTS}:{tmp_path}"},
        cwd=tmp_path,
    )
    try:
        return run_blocks(page, Run(tmp_path, own.redis_url, own.namespace), skip=skip)
    finally:
        own.stop()


def test_readme_fits_on_a_screen_and_every_block_is_code_that_runs() -> None:
    """At most 200 lines; every block is bash, python or text, and none is a fragment."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines"
    page = blocks(README)
    assert {b.lang for b in page} <= {"bash", "python", "text"}, [b.lang for b in page]
    assert not [b.where for b in page if b.marker == "fragment"]
    assert page[0].line == 3 and page[0].lang == "bash", "the two commands come first"
    assert "../shared" not in README.read_text(encoding="utf-8")


def test_readme_first_block_is_what_ci_runs() -> None:
    """``.ci/run``'s own reader finds commands 1 and 2 in the README's first block: the demo
    and the test command, exactly as the block shows them (CI runs them offline)."""
    source = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    start = source.index("readme_command() {")
    reader = source[start : source.index("\n}\n", start) + 3]
    found = {}
    for number in (1, 2):
        done = subprocess.run(
            ["bash", "-c", f"{reader}\nreadme_command {number}"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        found[number] = done.stdout.strip()
    lines = blocks(README)[0].body.splitlines()
    shown = {int(line[2]): lines[i + 1] for i, line in enumerate(lines) if line[:2] == "# "}
    assert found == shown, (found, shown)
    assert found[1].endswith(".venv/bin/toolfleet demo") and "pip install -e '.[demo]'" in found[1]
    assert found[2].endswith("bash .ci/check") and "'.[dev]'" in found[2]


def test_readme_blocks_run_against_a_fleet(fleet: Fleet, tmp_path: Path) -> None:
    """The producer example prints what the README says against a real fleet; the extension
    example, saved as the README says, is served by a fleet started with the README's
    ``toolfleet worker`` line and answers the README's calls."""
    first, *page = blocks(README)  # the two commands: CI runs them (test above)
    assert sum(b.lang == "python" and not b.marker for b in page) >= 1
    assert any(worker_command(b) for b in page)
    ran = _run_page(README, fleet, tmp_path, skip=frozenset({first.line}))
    assert ran >= 2


@pytest.mark.parametrize(
    "path",
    [p for p in PAGES if _runnable(blocks(p))],
    ids=lambda p: str(p.relative_to(DOCS)),
)
def test_docs_blocks_run(path: Path, fleet: Fleet, tmp_path: Path) -> None:
    """Every python and bash block of a docs page not marked ``<!-- fragment -->`` runs
    against a real fleet (and prints what an ``<!-- output -->`` block after it says).
    A page that calls the python tool needs its sandbox: where it cannot start (no
    ``bwrap``) the fleet does not serve that tool, so the page cannot run as written."""
    if "ext_python_run" in path.read_text(encoding="utf-8"):
        require_sandbox()
    assert _run_page(path, fleet, tmp_path) >= 1


def test_every_block_is_of_a_known_kind() -> None:
    """Each block says its language, one the tests know: python and bash run (or are marked),
    text is a diagram or an output, toml/json/yaml are configuration as written."""
    odd = [b.where for p in [README, *PAGES] for b in blocks(p) if b.lang not in KINDS]
    assert not odd, f"blocks of no known kind (```python, ```bash, ```text, ...): {odd}"


def test_markers_mark_a_block() -> None:
    """Every ``<!-- fragment -->``, ``<!-- file: -->`` and ``<!-- output -->`` marker stands
    right above a fenced block (a stray one would leave a block unrun unnoticed)."""
    dangling = {str(p): markers_without_block(p) for p in [README, *PAGES]}
    assert not {p: lines for p, lines in dangling.items() if lines}


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        # not --quiet: it hides the warnings that --strict counts
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=config.parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(MKDOCS.parent), "HOME": str(site.parent)},
    )


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    """``mkdocs build --strict`` passes offline, and the API reference holds the docstrings."""
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    api = (tmp_path / "site" / "reference" / "producer" / "index.html").read_text()
    assert "Submit one call" in api or "submit" in api
    assert (
        "ToolClient" in api
        and "raise_for_status"
        in (tmp_path / "site" / "reference" / "wire" / "index.html").read_text()
    )


def test_docs_build_fails_on_a_broken_link(tmp_path: Path) -> None:
    """The same build (which passes on the real pages, above) fails when a page links to a
    page or an anchor that does not exist, and says which."""
    copy = tmp_path / "repo"
    copy.mkdir()
    shutil.copy(ROOT / "mkdocs.yml", copy)
    for folder in ("docs", "shared", "producer", "worker", "extensions", "testing", "deploy"):
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    page = copy / "docs" / "operations.md"
    broken = "\nSee [nowhere](no-such-page.md) and [no part](tenants.md#no-such-part).\n"
    page.write_text(page.read_text() + broken)
    done = _build(copy / "mkdocs.yml", tmp_path / "site")
    warnings = [line for line in (done.stdout + done.stderr).splitlines() if "WARNING" in line]
    assert done.returncode != 0
    assert len(warnings) == 2, warnings
    assert "no-such-page.md" in warnings[0] + warnings[1]
    assert "#no-such-part" in warnings[0] + warnings[1]


def test_the_documented_build_leaves_the_work_tree_clean(tmp_path: Path) -> None:
    """``mkdocs build --strict`` as docs/about-docs.md runs it (no ``-d``), in a git work tree
    holding the site's sources: the site lands in ``build/site`` and ``git status`` stays
    clean (a site written next to the sources would be an untracked folder)."""
    tree = tmp_path / "repo"
    tree.mkdir()
    for name in ("mkdocs.yml", ".gitignore", "README.md"):
        shutil.copy(ROOT / name, tree)
    for folder in ("docs", "shared", "producer", "worker", "extensions", "testing", "deploy"):
        shutil.copytree(ROOT / folder, tree / folder, ignore=shutil.ignore_patterns("__pycache__"))

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *argv],
            cwd=tree, capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "docs")
    done = subprocess.run(
        [str(MKDOCS), "build", "--strict"],
        cwd=tree, capture_output=True, text=True, timeout=300, check=False,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": os.pathsep.join([str(MKDOCS.parent),
             os.environ.get("PATH", "")]), "HOME": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert git("status", "--porcelain", "--untracked-files=all") == ""
    assert (tree / "build" / "site" / "index.html").is_file()
