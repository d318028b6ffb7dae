"""The package is what a cluster runs: the engine does not import the demo generator, nothing imports the
repository's tools, no module finds repository folders relative to its own file, and only the notebooks' helpers
(`analyst`, an extra of the wheel) need plotting."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lib" / "fraudrules"
MODULES = sorted(PACKAGE.rglob("*.py"))
ANALYST = sorted((PACKAGE / "analyst").glob("*.py"))
CORE = [m for m in MODULES if m not in ANALYST]


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


def _module(path: Path) -> str:
    name = ".".join(path.relative_to(ROOT / "lib").with_suffix("").parts)
    return name.removesuffix(".__init__")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph: its strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_package_has_no_import_circles():
    """Lazy imports included: a circle means neither module can be understood, or moved, without the other."""
    modules = {_module(p) for p in MODULES}
    graph = {_module(p): (imported(p) & modules) - {_module(p)} for p in MODULES}
    assert _cycles(graph) == []
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # it finds one


def test_the_package_s_parts_are_layers():
    """Between its parts (a subpackage, or a top-level module) too: no part imports one that imports it back, so
    each depends only on those below it (config at the bottom, then compat, ..., the CLI at the top)."""

    def part(module: str) -> str:
        return module.split(".")[1] if "." in module else module

    modules = {_module(p) for p in MODULES}
    graph: dict[str, set[str]] = {}
    for p in MODULES:
        names = {n.rsplit(".", 1)[0] if n not in modules else n for n in imported(p)} & modules
        graph.setdefault(part(_module(p)), set()).update(part(n) for n in names if part(n) != part(_module(p)))
    assert _cycles(graph) == []
    assert graph["compat"] <= {"config"} and "cli" not in set().union(*graph.values())


@pytest.mark.parametrize("path", sorted((ROOT / "tools").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_tools_do_not_import_the_tests(path):
    """Tests may use the dev tools (tools/support: the local broker, the crash demo, fixtures' data), not the other
    way round."""
    assert not {m for m in imported(path) if m == "tests" or m.startswith("tests.")}


@pytest.mark.parametrize("path", sorted((PACKAGE / "engine").glob("*.py")), ids=lambda p: p.name)
def test_the_engine_does_not_import_the_generator(path):
    assert not {m for m in imported(path) if m.startswith("fraudrules.generator")}


def test_loading_the_job_loads_no_generator():
    """Transitively: the job, its sources, sinks and processors, and the run loop."""
    code = "import sys, fraudrules.engine.job, fraudrules.engine.run; print('fraudrules.generator' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_core_does_not_import_the_analyst_helpers(path):
    assert not {m for m in imported(path) if m.startswith("fraudrules.analyst")}


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~ \[;]", r, maxsplit=1)[0].lower() for r in requirements}


def third_party(paths: list[Path]) -> set[str]:
    tops = {m.split(".")[0] for path in paths for m in imported(path)}
    return {m.lower() for m in tops if m not in sys.stdlib_module_names and m not in ("fraudrules", "__future__")}


def test_the_analyst_extra_holds_what_only_the_notebooks_helpers_import():
    """What `analyst` imports beyond the core is its extra (the streaming job's wheel installs without it), and
    the local environment pins it (`make setup`: the notebooks and their tests run there)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["analyst"]
    assert third_party(ANALYST) - third_party(CORE) <= requirement_names(extra)
    pinned = (ROOT / "requirements.txt").read_text().splitlines()
    assert requirement_names(extra) <= requirement_names([r for r in pinned if r and not r.startswith("#")])


@pytest.mark.parametrize("path", sorted((ROOT / "dags").glob("*.py")), ids=lambda p: p.name)
def test_the_dags_run_no_code_from_tools(path):
    """A DAG's tasks run the job environment's package (`python -m fraudrules...`), not the repository's tools."""
    assert not re.findall(r"\btools[./]\w+", path.read_text())


def test_loading_the_job_loads_no_local_runtime():
    """A cluster's session never loads what only a local JVM needs (`local_runtime`): the session loads it when it
    starts one."""
    modules = "fraudrules.session, fraudrules.engine.job, fraudrules.engine.run"
    code = f"import sys, {modules}; print('fraudrules.local_runtime' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


# a private attribute of PySpark's (`SparkContext._jvm`, `spark._jsparkSession`, `SparkContext._gateway`, ...), or a
# private name imported from PySpark, Delta, delta-rs or Great Expectations
PRIVATE = re.compile(
    r"\._j[a-zA-Z]|\._gateway\b|from (?:pyspark|delta|deltalake|great_expectations)[\w.]* import [^#\n]*\b_[A-Za-z]"
)
COMPAT = PACKAGE / "compat"
OUTSIDE_COMPAT = [m for m in MODULES if COMPAT not in m.parents]


@pytest.mark.parametrize("path", OUTSIDE_COMPAT, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_third_party_internals_are_used_in_the_compat_package_only(path):
    assert not PRIVATE.findall(path.read_text()), f"{path.name}: move this behind fraudrules.compat"
    assert PRIVATE.findall("jvm = spark.sparkContext._jvm") and PRIVATE.findall("from delta.x import y, _z")


def test_the_compat_package_is_the_lowest_layer():
    """It imports nothing of the package but the config's Databricks check: any layer may use it."""
    for module in COMPAT.glob("*.py"):
        ours = {n for n in imported(module) if n.startswith("fraudrules.") and not n.startswith("fraudrules.compat")}
        assert ours <= {"fraudrules.config", "fraudrules.config.on_databricks"}, module.name


def test_the_wheel_lists_every_package_of_the_library():
    """pyproject.toml names the packages by hand: a new subpackage missing there is missing from the wheel a
    cluster installs (tests/e2e/test_wheel.py finds that late)."""
    listed = set(re.findall(r'"(fraudrules[\w.]*)"', (ROOT / "pyproject.toml").read_text().split("packages = [")[1]))
    found = {".".join(p.parent.relative_to(PACKAGE.parent).parts) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
