"""Import boundaries between the parts (producer, shared, worker, extensions)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_producer_imports_no_worker_or_extension_code() -> None:
    """A fresh interpreter importing toolfleet.producer loads no worker or extension module."""
    code = (
        "import sys, toolfleet.producer\n"
        "parts = ('toolfleet.worker', 'toolfleet.extensions')\n"
        "bad = [m for m in sys.modules if m.startswith(parts)]\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def test_shared_imports_no_other_part() -> None:
    """toolfleet.shared imports neither producer, worker nor extensions."""
    code = (
        "import sys, toolfleet.shared\n"
        "bad = [m for m in sys.modules if m.startswith(('toolfleet.worker', 'toolfleet.producer', "
        "'toolfleet.extensions'))]\n"
        "sys.exit(1 if bad else 0)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- static checks over the source: no import cycles, imports run one way ------------------

PARTS = ("shared", "producer", "worker", "extensions", "testing", "ui")


def _modules() -> dict[str, Path]:
    """Every module of the five parts: dotted name (``toolfleet.worker.cli.main``) -> file."""
    found: dict[str, Path] = {}
    for part in PARTS:
        for path in (ROOT / part).rglob("*.py"):
            names = list(path.relative_to(ROOT).with_suffix("").parts)
            if names[-1] == "__init__":
                names.pop()
            found["toolfleet." + ".".join(names)] = path
    return found


MODULES = _modules()


def _typing_only(tree: ast.Module) -> set[ast.AST]:
    """The import statements inside ``if TYPE_CHECKING:`` blocks (never run)."""
    hidden: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in (
            "TYPE_CHECKING",
            "typing.TYPE_CHECKING",
        ):
            for statement in node.body:
                hidden.update(ast.walk(statement))
    return hidden


def _imports(name: str, path: Path, *, typing_too: bool = False) -> set[str]:
    """The toolfleet modules ``name`` imports anywhere in its file, lazy imports included.

    ``from package import module`` counts as importing the module; ``from module import
    name`` as importing the module. Imports under ``if TYPE_CHECKING:`` count only with
    ``typing_too`` (they never run: an annotation may name a class of a module that
    imports this one).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    hidden = set() if typing_too else _typing_only(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if node in hidden:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}"
                found.add(full if full in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}
#: With the imports under ``if TYPE_CHECKING:``: for the one-way rule between the parts.
FULL_GRAPH = {name: _imports(name, path, typing_too=True) for name, path in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The finder reports a two-module cycle and a three-module one, and no acyclic chain."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_import_graph_sees_relative_and_lazy_imports() -> None:
    """The graph holds the edges the checks rely on (so an empty graph cannot pass them)."""
    assert "toolfleet.worker.registry.registry" in GRAPH["toolfleet.worker.isolation.child"]
    assert "toolfleet.worker.isolation.base" in GRAPH["toolfleet.worker.isolation"]
    assert "toolfleet.shared.naming" in GRAPH["toolfleet.producer.catalog"]
    typing_only = "toolfleet.worker.isolation.process"  # ProcessRunner in an annotation
    assert typing_only in FULL_GRAPH["toolfleet.worker.pipeline.calls"]
    assert typing_only not in GRAPH["toolfleet.worker.pipeline.calls"]


def test_no_module_imports_a_module_that_imports_it_back() -> None:
    """No import cycle anywhere in the five parts, lazy imports inside functions included."""
    assert _cycles(GRAPH) == []


#: Which parts each part may import (a module always may import its own part).
ALLOWED = {
    "toolfleet.shared": (),
    "toolfleet.producer": ("toolfleet.shared",),
    "toolfleet.extensions": ("toolfleet.shared",),
    # the ops page reads Redis as the producer does and republishes dead letters through it
    "toolfleet.ui": ("toolfleet.shared", "toolfleet.producer"),
    # how a tool runs: a leaf; its child process builds the registry and logs as a worker
    # process does (the logging setup, itself importing only the registry's redaction)
    "toolfleet.worker.isolation": (
        "toolfleet.shared",
        "toolfleet.worker.registry",
        "toolfleet.worker.supervision.logs",
    ),
    # what is served: extensions, their settings and switches, MCP sessions
    "toolfleet.worker.registry": ("toolfleet.shared", "toolfleet.worker.mcp"),
    "toolfleet.worker": (
        "toolfleet.shared",
        "toolfleet.producer",
        "toolfleet.extensions",
        "toolfleet.ui",  # `toolfleet ui` serves it (imported when the command runs)
    ),
    # users' test helpers: the worker's own pipeline and fleet; no other part imports them
    "toolfleet.testing": ("toolfleet.shared", "toolfleet.producer", "toolfleet.worker"),
}


def _part_of(module: str) -> str:
    return max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)


def _inside(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_imports_run_one_way_between_the_parts() -> None:
    """shared imports no other part; producer and extensions only shared; worker all three;
    testing shared, producer and worker, and nothing imports it; worker/isolation only shared
    and (its child) the registry and the logging setup; the
    registry no pipeline, Dramatiq or CLI code."""
    wrong = []
    for module, targets in sorted(FULL_GRAPH.items()):
        part = _part_of(module)
        for target in sorted(targets):
            if _inside(target, part) and _part_of(target) == part:
                continue
            if any(_inside(target, allowed) for allowed in ALLOWED[part]):
                continue
            if part == "toolfleet.worker" and _inside(target, "toolfleet.worker"):
                continue  # worker's own sub-packages, checked above where they are leaves
            wrong.append(f"{module} imports {target}")
    assert wrong == []


# --- every Redis key is named in shared/naming.py --------------------------------------------


def _names_a_namespace(expression: ast.expr) -> bool:
    text = ast.unparse(expression)
    return text.rpartition(".")[2] in ("namespace", "ns")


def _key_shaped(node: ast.AST) -> bool:
    """An f-string or a ``+`` that glues ``:...`` to a namespace: a Redis key built inline."""
    if isinstance(node, ast.JoinedStr):
        parts = node.values
        return any(
            isinstance(value, ast.FormattedValue)
            and _names_a_namespace(value.value)
            and isinstance(after, ast.Constant)
            and str(after.value).startswith(":")
            for value, after in zip(parts, parts[1:], strict=False)
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return (
            _names_a_namespace(node.left)
            and isinstance(node.right, ast.Constant)
            and str(node.right.value).startswith(":")
        )
    return False


def _inline_keys(source: str) -> list[str]:
    return [ast.unparse(n) for n in ast.walk(ast.parse(source)) if _key_shaped(n)]


def test_the_key_finder_finds_inline_keys() -> None:
    """f-strings and concatenations that build a key under a namespace are found; others not."""
    found = _inline_keys(
        'a = f"{namespace}:reply:{cid}"\nb = f"{self.namespace}:{q}.msgs"\n'
        'c = ns + ":x"\nd = f"{name}: {value}"\ne = f"{namespace}"\n'
    )
    assert found == ["f'{namespace}:reply:{cid}'", "f'{self.namespace}:{q}.msgs'", "ns + ':x'"]


def test_no_redis_key_is_built_outside_shared_naming() -> None:
    """Every Redis key name comes from a function of toolfleet.shared.naming."""
    inline = {
        str(path.relative_to(ROOT)): keys
        for path in MODULES.values()
        if path != ROOT / "shared" / "naming.py"
        and (keys := _inline_keys(path.read_text(encoding="utf-8")))
    }
    assert inline == {}
