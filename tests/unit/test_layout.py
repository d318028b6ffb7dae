"""The package is what a cluster runs: the engine does not import the demo generator, nothing imports the
repository's tools, and no module finds repository folders relative to its own file."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "lib" / "fraudrules"
MODULES = sorted(PACKAGE.rglob("*.py"))


def imported(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions included)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_tooling_and_no_repository_paths(path):
    assert not {m for m in imported(path) if m == "tools" or m.startswith(("tools.", "tests"))}
    assert "__file__" not in path.read_text(), "find package data with importlib.resources, not from __file__"


@pytest.mark.parametrize("path", sorted((PACKAGE / "engine").glob("*.py")), ids=lambda p: p.name)
def test_the_engine_does_not_import_the_generator(path):
    assert not {m for m in imported(path) if m.startswith("fraudrules.generator")}


def test_loading_the_job_loads_no_generator():
    """Transitively: the job, its sources, sinks and processors, and the run loop."""
    code = "import sys, fraudrules.engine.job, fraudrules.engine.run; print('fraudrules.generator' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
