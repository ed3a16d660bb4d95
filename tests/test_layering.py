"""Dependencies point one way: store and analysis never import torch/streamlit/altair; the
store's rankstats (each rank's answers) imports nothing of stepscope but itself; no package's
modules import each other in a circle (also lazily, inside a function); the store's write path is
in layers: where the files are, below the commit protocol, below ingest's orchestration."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "stepscope"
FORBIDDEN = {
    "store": {"torch", "streamlit", "altair", "stepscope.analysis", "stepscope.dashboard", "stepscope.collector"},
    "analysis": {"torch", "streamlit", "altair", "stepscope.dashboard", "stepscope.collector"},
    "collector": {"streamlit", "altair", "stepscope.dashboard", "stepscope.analysis"},
    # Each rank's answers sit below both the store's converter and the analyses (docs/ARCHITECTURE.md).
    "store/rankstats": {"torch", "streamlit", "altair", "stepscope"},
}
ALLOWED = {"store/rankstats": {"stepscope.store.rankstats"}}
"""Imports a layer may make although a banned name prefixes them (the package itself)."""


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("layer", list(FORBIDDEN))
def test_layer_imports(layer: str) -> None:
    for path in (PACKAGE / layer).rglob("*.py"):
        for name in _imports(path):
            if any(name == ok or name.startswith(ok + ".") for ok in ALLOWED.get(layer, ())):
                continue
            for banned in FORBIDDEN[layer]:
                assert not (name == banned or name.startswith(banned + ".")), f"{path} imports {name}"


LEAVES = {"units.py": set(), "render/table.py": {"stepscope.units"}}
"""Modules that import (almost) nothing else of stepscope: the analysis layer and the renderers
format through units.py, and the table model must not drag the analyses into whoever draws a table."""


@pytest.mark.parametrize("leaf", list(LEAVES))
def test_leaves_import_nothing_from_stepscope(leaf: str) -> None:
    names = {n for n in _imports(PACKAGE / leaf) if n.startswith("stepscope")}
    assert names <= LEAVES[leaf], names


def test_analysis_does_not_import_render() -> None:
    """render draws what analysis computes: an import the other way is an arrow back up (the
    units both need live below both, in stepscope/units.py)."""
    for path in (PACKAGE / "analysis").rglob("*.py"):
        bad = {n for n in _imports(path) if n == "stepscope.render" or n.startswith("stepscope.render.")}
        assert not bad, f"{path} imports {sorted(bad)}"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
PACKAGES = sorted(name for name, path in MODULES.items() if path.name == "__init__.py")


def _imported_modules(name: str) -> set[str]:
    """The stepscope modules ``name`` imports, anywhere in it (a function's lazy import too):
    ``import a.b``, ``from a import b`` (the module ``a.b`` when there is one, else ``a``),
    relative imports, and ``import_module("a.b")`` with a literal name."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "import_module"
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            found.add(node.args[0].value)
    modules = set()
    for imported in found:
        while imported and imported not in MODULES:  # ``from a.b import function``: the module a.b
            imported = imported.rpartition(".")[0]
        if imported and imported != name:
            modules.add(imported)
    return modules


def _package_graph(package: str) -> dict[str, set[str]]:
    """The import graph of ``package``'s own modules; a subpackage is one node (its modules'
    imports are its own), the package's ``__init__`` is the node named after the package."""
    def node(module: str) -> str | None:
        if module == package:
            return package
        if not module.startswith(package + "."):
            return None
        return f"{package}.{module[len(package) + 1:].split('.')[0]}"

    graph: dict[str, set[str]] = {}
    for module in MODULES:
        here = node(module)
        if here is not None:
            targets = {node(m) for m in _imported_modules(module)} - {None, here}
            graph.setdefault(here, set()).update(targets)  # type: ignore[arg-type]
    return graph


def _a_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (its modules in order, the first repeated), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in state and (circle := visit(target)):
                return circle
        state[module] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (circle := visit(module)):
            return circle
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_in_a_package(package: str) -> None:
    circle = _a_circle(_package_graph(package))
    assert circle is None, " -> ".join(circle)


def test_the_circle_finder_finds_a_lazy_circle(tmp_path: Path) -> None:
    """The check itself: a circle closed by an import inside a function is found."""
    assert _a_circle({"p.a": {"p.b"}, "p.b": {"p.c"}, "p.c": {"p.a"}}) == ["p.a", "p.b", "p.c", "p.a"]
    assert _a_circle({"p.a": {"p.b"}, "p.b": set(), "p.c": {"p.b"}}) is None
    assert "stepscope.store.catalog" in _imported_modules("stepscope.store")  # import_module("...")
    assert "stepscope.store.objectstore" in _imported_modules("stepscope.store.writer")  # inside a function


STORE_LAYERS = (
    ("location", {"location", "objectstore"}),
    ("commit protocol", {"writer", "dedupe", "sessions", "jobs", "commit", "remote_commit"}),
    ("orchestration", {"ingest", "ray_engine"}),
)
"""The store's write path, bottom up: where the files are (a folder or a URL: listing, reading,
uploading, the S3 lock object), how a trace is committed there (parts, the same-trace, overlap,
session and job rules, the commit lock, the ``sources`` row), and ingest, which converts files and
batches them (worker processes, Ray) over both. A layer imports none above it."""


@pytest.mark.parametrize("layer", range(len(STORE_LAYERS)))
def test_store_write_path_is_in_layers(layer: int) -> None:
    above = {f"stepscope.store.{m}" for _, modules in STORE_LAYERS[layer + 1:] for m in modules}
    for module in sorted(STORE_LAYERS[layer][1]):
        wrong = _imported_modules(f"stepscope.store.{module}") & above
        assert not wrong, f"store/{module}.py ({STORE_LAYERS[layer][0]}) imports {sorted(wrong)} from above"


def test_cli_start_does_not_import_heavy_modules() -> None:
    import subprocess
    import sys

    code = ("import sys; from stepscope.cli import build_parser; build_parser(None); "
            "print(sorted(m for m in ('torch', 'duckdb', 'pyarrow', 'pandas', 'streamlit', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
