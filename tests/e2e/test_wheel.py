"""The wheel a cluster installs: built from the repository, installed into a clean venv outside it, and run
from there: `fraudrules --help`, and the data-quality run opening the GX project inside the installed package (and
failing, naming it, on a data dir whose streaming state is missing).

The clean venv gets fraudrules from the wheel only; its dependencies (Spark, Great Expectations, ...) are
borrowed from the project's environment by a path entry, so that nothing is downloaded here. That entry does
not run the project environment's own `.pth` files, so its editable install of fraudrules stays out of it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tools.support.real_tables import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM")]
SUITES = {
    "alerts",
    "shadow_alerts",
    "late_events",
    "quarantine",
    "rules",
    "transactions",
    "logins",
    "window_state",
    "login_state",
}


def _run(cmd: list, cwd: Path, timeout: float = 600, drop: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", *drop)}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir", dist, REPO]
    proc = _run(build, cwd=dist)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (whl,) = dist.glob("fraudrules-*.whl")
    return whl


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv") / "clean"
    assert _run([sys.executable, "-m", "venv", root], cwd=root.parent).returncode == 0
    site = Path(
        _run(
            [root / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=root
        ).stdout.strip()
    )
    (site / "project-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    proc = _run([root / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel], cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def test_the_wheel_holds_the_engine_and_the_suites_and_no_tooling(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"fraudrules", f"{wheel.name.split('-py3')[0]}.dist-info"}
    project = [n.removeprefix("fraudrules/expectations/") for n in names if n.startswith("fraudrules/expectations/")]
    assert {Path(n).stem for n in project if n.startswith("suites/")} == SUITES
    assert {Path(n).stem for n in project if n.startswith("validation_definitions/")} == SUITES
    assert {"great_expectations.yml", "checkpoints/fraudrules.json"} <= set(project)
    assert "fraudrules/sample_rules.json" in names
    packages = {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    in_repo = {str(p.parent.relative_to(REPO / "lib")) for p in (REPO / "lib" / "fraudrules").rglob("__init__.py")}
    assert packages == {*in_repo, "fraudrules/expectations"}  # every package of lib/ (pyproject lists them)
    tooling = ("crash_demo", "kafka_local", "bench", "notebooks_runner", "demo_rules", "tests/")
    assert not [n for n in names if any(t in n for t in tooling)]


def test_plotting_is_the_analyst_extra_not_a_dependency_of_the_wheel(wheel):
    """The streaming job's wheel installs without plotting; `fraudrules[analyst]` (the notebooks) brings it."""
    info = f"{wheel.name.split('-py3')[0]}.dist-info/METADATA"
    metadata = zipfile.ZipFile(wheel).read(info).decode().splitlines()
    requires = [line.removeprefix("Requires-Dist: ") for line in metadata if line.startswith("Requires-Dist: ")]
    plotting = [r for r in requires if r.startswith("matplotlib")]
    assert plotting and all('extra == "analyst"' in r for r in plotting), requires


def test_installed_cli_and_quality_run_outside_the_repository(venv, backtest_data, tmp_path):
    where = _run(
        [venv / "bin" / "python", "-c", "import fraudrules.ops.quality as q; print(q.__file__, q.project_dir())"],
        cwd=tmp_path,
    ).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in where), where  # the package and its GX project: from the wheel
    assert {p.stem for p in (Path(where[1]) / "suites").glob("*.json")} == SUITES

    helped = _run([venv / "bin" / "fraudrules", "--help"], cwd=tmp_path)
    assert helped.returncode == 0, helped.stderr
    for command in ("run", "backtest", "quality", "status", "rules"):
        assert command in helped.stdout
    assert not any(tool in helped.stdout for tool in ("bench", "crash-demo", "demo-rules"))

    # The tables of a real run without its checkpoints: the state cannot be found, so the check fails saying so.
    data = tmp_path / "data"
    shutil.copytree(backtest_data / "tables", data / "tables")
    # An installed wheel has no jars of its own: without FRAUDRULES_JARS a command says so, on one line.
    bare = _run(
        [venv / "bin" / "fraudrules", "rules", "list", "--data-dir", data], cwd=tmp_path, drop=("FRAUDRULES_JARS",)
    )
    assert (bare.returncode, bare.stdout) == (2, ""), bare.stderr[-3000:]
    assert (
        bare.stderr.startswith("fraudrules rules: no Spark jars: set FRAUDRULES_JARS to a folder")
        and len(bare.stderr.splitlines()) == 1
    ), bare.stderr
    report = tmp_path / "report.json"
    proc = _run([venv / "bin" / "fraudrules", "quality", "--data-dir", data, "--report", report], cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "data quality FAILED on login_state, window_state" in proc.stdout
    assert f"the evaluate query has no committed batch under {data}/checkpoints/evaluate" in proc.stdout
    result = json.loads(report.read_text())
    assert result["failed"] == ["window_state: input_found()", "login_state: input_found()"]
    assert result["rows"] == {}  # nothing validated: a run never passes on what it could not read
