"""The layering rules, checked on the source: plugins use only sgd's public API, and
sgd-core's modules import each other without a circle.

Imports are read with ``ast`` from every ``.py`` file, including imports inside functions;
imports under ``if TYPE_CHECKING:`` are left out (they never run).
"""

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ROOT / "packages"


def _sources() -> Iterator[Tuple[str, Path, Path]]:
    """``(top-level import name, package src dir, file)`` for every source file of every package."""
    for src in sorted(PACKAGES.glob("*/src")):
        for top in sorted(p for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
            for path in sorted(top.rglob("*.py")):
                yield top.name, src, path


def _module_name(src: Path, path: Path) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


class _Imports(ast.NodeVisitor):
    """``(module, names)`` of every import statement that runs (not under TYPE_CHECKING)."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package = module, is_package
        self.found: List[Tuple[str, List[str], int]] = []

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.found.append((alias.name, [], node.lineno))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.module.split(".")
            keep = len(base) - node.level + (1 if self.is_package else 0)
            module = ".".join(base[:keep] + ([node.module] if node.module else []))
        else:
            module = node.module or ""
        self.found.append((module, [a.name for a in node.names], node.lineno))


def _imports(src: Path, path: Path) -> List[Tuple[str, List[str], int]]:
    visitor = _Imports(_module_name(src, path), path.name == "__init__.py")
    visitor.visit(ast.parse(path.read_text(encoding="utf-8")))
    return visitor.found


def test_no_package_imports_another_packages_privates():
    tops = {top for top, _, _ in _sources()}
    offences = []
    for top, src, path in _sources():
        for module, names, line in _imports(src, path):
            other = module.split(".")[0]
            if other not in tops or other == top:
                continue
            where = f"{path.relative_to(ROOT)}:{line}"
            private_parts = [p for p in module.split(".")[1:] if p.startswith("_")]
            if private_parts:
                offences.append(f"{where} imports {module}")
            offences += [f"{where} imports {n} from {module}" for n in names if n.startswith("_")]
    assert not offences, "plugins must use sgd's public API only:\n" + "\n".join(offences)


def _core_graph() -> Dict[str, Set[str]]:
    src = PACKAGES / "sgd-core" / "src"
    modules = {_module_name(src, p): p for p in (src / "sgd").rglob("*.py")}
    graph: Dict[str, Set[str]] = {}
    for name, path in modules.items():
        edges: Set[str] = set()
        for module, names, _ in _imports(src, path):
            targets = [f"{module}.{n}" for n in names if f"{module}.{n}" in modules]
            if len(targets) < len(names) or not names:
                targets.append(module)  # `import m`, or names defined in m itself
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_sgd_core_has_no_import_circle():
    cycles = _cycles(_core_graph())
    assert not cycles, "import circles in sgd-core:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_finds_a_circle():
    # The check itself can fail: a planted circle is found.
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_the_launcher_sits_above_the_trainer():
    graph = _core_graph()
    assert "sgd.trainer" in graph["sgd.launcher"]
    below = {m for m in graph if m.startswith("sgd._internal")} | {"sgd.trainer", "sgd.worker_group"}
    assert not any(m.startswith("sgd.launcher") for b in below for m in graph[b])
