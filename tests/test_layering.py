"""Dependencies point one way: store and analysis never import torch/streamlit/altair; the
store's rankstats (each rank's answers) imports nothing of stepscope but itself."""

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


def test_cli_start_does_not_import_heavy_modules() -> None:
    import subprocess
    import sys

    code = ("import sys; from stepscope.cli import build_parser; build_parser(None); "
            "print(sorted(m for m in ('torch', 'duckdb', 'pyarrow', 'pandas', 'streamlit', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
