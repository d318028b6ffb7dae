"""The versions of PySpark, Delta and Great Expectations are pinned in several files that must move together on an
upgrade (docs/operations.md, "Upgrading PySpark, Delta, Great Expectations"): each pin read where it is written."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

from fraudrules.compat import delta_log, spark_jvm
from fraudrules.compat import pyspark as pyspark_compat

ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS = {"great_expectations": "requirements-quality.txt", "delta-spark": "requirements-nodeps.txt"}


def _found(pattern: str, path: str) -> list[str]:
    values = re.findall(pattern, (ROOT / path).read_text())
    assert values, f"no match of {pattern!r} in {path}: the pin moved; update this test and the upgrade section"
    return values


def _pins(package: str) -> dict[str, set[str]]:
    """Where a Python package is pinned: the requirements files, the extras, the bundle's jobs."""
    pin = rf"{re.escape(package)}==([0-9][\w.]*)"
    requirements = REQUIREMENTS.get(package, "requirements.txt")
    out = {requirements: set(_found(rf"(?m)^{pin}", requirements))}
    if package != "delta-spark":  # not in an extra: its metadata caps pyspark below ours (requirements-nodeps.txt)
        out["pyproject.toml"] = set(_found(pin, "pyproject.toml"))
    for job in sorted((ROOT / "resources").glob("*.yml")):
        if found := re.findall(pin, job.read_text()):
            out[f"resources/{job.name}"] = set(found)
    return out


def _one(pins: dict[str, set[str]]) -> str:
    versions = set().union(*pins.values())
    assert len(versions) == 1, pins
    return versions.pop()


def test_pyspark_is_one_version_in_python_the_jvm_jars_and_the_compat_guard():
    version = _one(_pins("pyspark"))
    assert _found(r"<spark.version>([^<]+)</spark.version>", "jvm/spark/pom.xml") == [version]
    minor = ".".join(version.split(".")[:2])
    kafka = _found(r"<spark.kafka.version>([^<]+)</spark.kafka.version>", "jvm/spark/pom.xml")[0]
    assert (
        kafka.startswith(f"{minor}.") and kafka <= version
    )  # the Kafka connector: the same minor, a patch behind at most
    assert _found(r"<artifactId>delta-spark_([0-9.]+)_2.13</artifactId>", "jvm/spark/pom.xml") == [minor]
    assert version == pyspark_compat.RELEASE
    assert metadata.version("pyspark") == version  # what `make setup` installed


def test_delta_is_one_version_in_python_and_the_jvm_jars():
    version = _one(_pins("delta-spark"))
    assert '"delta-spark' not in (ROOT / "pyproject.toml").read_text()  # an extra could not install it beside pyspark
    assert f"--no-deps delta-spark=={version}" in (ROOT / "README.md").read_text()  # how a wheel's user installs it
    assert _found(r"<delta.version>([^<]+)</delta.version>", "jvm/spark/pom.xml") == [version]
    assert metadata.version("delta-spark") == version
    assert version == delta_log.DELTA_RELEASE  # the release whose first commit the job writes by hand


def test_spark_s_checkpoint_file_manager_is_named_for_the_pinned_minor_release():
    minor = ".".join(_one(_pins("pyspark")).split(".")[:2])
    assert minor == spark_jvm.CHECKPOINT_FILES_SPARK
    manager = spark_jvm.checkpoint_files_conf()["spark.sql.streaming.checkpointFileManagerClass"]
    assert manager == spark_jvm.CHECKPOINT_FILES


def test_great_expectations_is_one_version_in_the_venv_the_extra_and_the_bundle():
    pins = _pins("great_expectations")
    assert any(k.startswith("resources/") for k in pins), pins  # the bundle's quality job installs it too
    version = _one(pins)
    pytest.importorskip("great_expectations")
    assert metadata.version("great_expectations") == version
    from fraudrules.compat import great_expectations as gx_compat

    assert version == gx_compat.GX_RELEASE  # the release the data-quality sources are built on


def test_the_local_file_system_is_built_against_the_hadoop_of_the_pyspark_wheel():
    hadoop = _found(r"<hadoop.version>([^<]+)</hadoop.version>", "jvm/localfs/pom.xml")[0]
    jars = Path(metadata.distribution("pyspark").locate_file("pyspark/jars"))
    assert (jars / f"hadoop-client-api-{hadoop}.jar").is_file(), sorted(p.name for p in jars.glob("hadoop-client*"))
