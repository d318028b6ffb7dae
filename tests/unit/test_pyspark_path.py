"""Python workers import PySpark from the installed package (`fraudrules.pyspark_path`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pyspark

from fraudrules.pyspark_path import prefer_installed


def _installed(site: Path, py4j: str = "0.10.9.9") -> Path:
    """A site folder with a PySpark package and its python/lib zips, and py4j's release `py4j` installed."""
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").touch()
    (site / f"py4j-{py4j}.dist-info").mkdir()
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        (lib / name).touch()
    return lib


def test_the_zips_of_the_installed_pyspark_leave_the_path_and_nothing_else_does(tmp_path):
    site = tmp_path / "site-packages"
    lib = _installed(site)
    other = tmp_path / "spark-4.2.0" / "python" / "lib" / "pyspark.zip"  # a Spark download's: not installed here
    entries = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), str(other), "/a/x.jar", str(site)]
    prefer_installed(entries)
    assert entries == [str(other), "/a/x.jar", str(site)]


def test_py4j_source_zip_stays_unless_the_installed_py4j_is_its_release(tmp_path):
    site = tmp_path / "site-packages"
    lib = _installed(site, py4j="0.10.9.7")
    entries = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip"), str(site)]
    prefer_installed(entries)
    assert entries == [str(lib / "py4j-0.10.9.9-src.zip"), str(site)]


def test_zips_stay_when_the_installed_packages_are_not_on_the_path(tmp_path):
    lib = _installed(tmp_path / "site-packages")
    entries = [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]
    prefer_installed(entries)
    assert entries == [str(lib / "pyspark.zip"), str(lib / "py4j-0.10.9.9-src.zip")]


def test_an_interpreter_of_the_environment_started_as_spark_starts_workers_imports_the_installed_pyspark():
    """Spark's PYTHONPATH for its workers: the installed PySpark's zips first. (The .pth file that makes it so is
    installed by `make setup`.)"""
    lib = os.path.join(os.path.dirname(pyspark.__file__), "python", "lib")
    zips = [os.path.join(lib, n) for n in sorted(os.listdir(lib)) if n.endswith(".zip")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(zips)}
    code = "import pyspark, py4j; print(pyspark.__file__); print(py4j.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert ".zip" not in out and out.count("site-packages") == 2
