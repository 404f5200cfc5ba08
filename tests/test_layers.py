"""The layering rules, checked on the source: plugins use only sgd's public API, and
sgd-core's modules import each other without a circle, in the layers written down in the
repository's ``pyproject.toml`` (``[tool.importlinter]``, run by ``nox -s lint``).

Two independent readers: import-linter (grimp), and a small ``ast`` reader here. Both count
imports inside functions and under ``if TYPE_CHECKING:``.
"""

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest
import tomllib

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
    """``(module, names, line)`` of every import statement, also in functions and under
    ``TYPE_CHECKING`` (a type-only edge still ties the modules together for a reader)."""

    def __init__(self, module: str, is_package: bool):
        self.module, self.is_package = module, is_package
        self.found: List[Tuple[str, List[str], int]] = []

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
    below = {m for m in graph if m.startswith(("sgd.storage", "sgd.trainer"))} | {"sgd.worker_group"}
    assert {"sgd.trainer", "sgd.trainer.trainer"} <= below
    assert not any(m.startswith("sgd.launcher") for b in below for m in graph[b])


# --- import-linter: the contracts in pyproject.toml ------------------------------------------

LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint_imports(cwd: Path, config: Path, pythonpath: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=pythonpath) if pythonpath else dict(os.environ)
    return subprocess.run([str(LINT_IMPORTS), "--config", str(config), "--no-cache"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_import_linter_contracts_hold():
    done = _lint_imports(ROOT, ROOT / "pyproject.toml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def _sgd_only_config(tmp_path: Path) -> Path:
    """The repository's sgd-core contracts, for a copy of sgd alone."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = [c for c in settings["contracts"] if c["id"] in ("sgd-layers", "sgd-acyclic")]
    assert len(contracts) == 2
    lines = ['[tool.importlinter]', 'root_package = "sgd"', '']
    for c in contracts:
        lines.append("[[tool.importlinter.contracts]]")
        for key, value in c.items():
            if isinstance(value, bool):
                lines.append(f"{key} = {str(value).lower()}")
            elif isinstance(value, list):
                lines.append(f"{key} = [" + ", ".join(f'"{v}"' for v in value) + "]")
            else:
                lines.append(f'{key} = "{value}"')
        lines.append("")
    config = tmp_path / "contracts.toml"
    config.write_text("\n".join(lines))
    return config


PLANTED = {
    # a leaf importing the trainer closes a circle (the trainer imports the leaf)
    "module level": ("errors.py", "\nfrom sgd.trainer import Trainer  # noqa\n"),
    "inside a function": ("checkpoint/format.py",
                          "\n\ndef _late():\n    from sgd.trainer import Trainer\n    return Trainer\n"),
    "type only": ("backend.py", "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                "    from sgd.worker_group import WorkerGroup  # noqa\n"),
}


@pytest.mark.parametrize("where", sorted(PLANTED))
def test_import_linter_fails_on_a_new_cycle(tmp_path, where):
    copy = tmp_path / "src"
    shutil.copytree(PACKAGES / "sgd-core" / "src" / "sgd", copy / "sgd",
                    ignore=shutil.ignore_patterns("__pycache__"))
    config = _sgd_only_config(tmp_path)
    clean = _lint_imports(tmp_path, config, str(copy))
    assert clean.returncode == 0, clean.stdout + clean.stderr  # the copy itself is fine
    name, text = PLANTED[where]
    with open(copy / "sgd" / name, "a") as f:
        f.write(text)
    broken = _lint_imports(tmp_path, config, str(copy))
    assert broken.returncode != 0, broken.stdout
    assert "BROKEN" in broken.stdout
    assert "sgd.trainer" in broken.stdout or "sgd.worker_group" in broken.stdout


def test_few_function_level_imports_of_sgd_itself():
    """Function-level imports of sgd's own modules hide edges; only modules that pull in a
    heavy optional dependency at import time (``ray.data``) are imported late."""
    src = PACKAGES / "sgd-core" / "src"
    late = []
    for path in sorted((src / "sgd").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and inner.level == 0:
                        names = [inner.module or ""]
                    elif isinstance(inner, ast.Import):
                        names = [a.name for a in inner.names]
                    else:
                        continue
                    if any(n == "sgd" or n.startswith("sgd.") for n in names):
                        late.append(f"{path.relative_to(src)}:{inner.lineno}")
    assert len(set(late)) <= 8, "function-level imports of sgd modules:\n" + "\n".join(sorted(set(late)))


# --- private attributes: other packages reach sgd-core through public names only --------------

#: Names that are not sgd's private state: ``_resources`` on a function trainable is Ray Tune's
#: protocol (Tune reads the resources of a trial from it); ``_remote`` is Ray's ``ActorMethod._remote``
#: (sgd_testing counts actor calls through it), whatever sgd-core names so.
NOT_SGD_PRIVATE = {"_resources", "_remote"}


def _private_names(files: List[Path]) -> Set[str]:
    """Private attributes and functions defined in ``files`` (``self._x``, ``def _x``, ``class _X``)."""
    names: Set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute):
                if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                    names.add(node.attr)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _private_reads(source: str, core_private: Set[str], own: Set[str]) -> List[str]:
    """``obj._name`` reads in ``source`` of a name private to sgd-core (not ``self``/``cls``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr in core_private and node.attr not in own
                and node.attr not in NOT_SGD_PRIVATE
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_plugin_reads_a_private_attribute_of_sgd_core():
    core_private = _private_names(sorted((PACKAGES / "sgd-core" / "src" / "sgd").rglob("*.py")))
    offences = []
    for src in sorted(PACKAGES.glob("*/src")):
        for top in sorted(p for p in src.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
            if top.name == "sgd":
                continue
            files = sorted(top.rglob("*.py"))
            own = _private_names(files)
            for path in files:
                offences += [f"{path.relative_to(ROOT)}:{r}" for r in
                             _private_reads(path.read_text(encoding="utf-8"), core_private, own)]
    assert not offences, "read sgd-core's private names (add a public one to sgd-core):\n" + "\n".join(offences)
    # The check can fail: what sgd-tune did before Trainer.min_workers existed is found.
    assert _private_reads("lo = trainer._min_workers", core_private, set()) == ["1: trainer._min_workers"]
