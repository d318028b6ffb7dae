"""Shared fixtures: one local Spark session (with Delta and RocksDB) for the integration tier."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

VENV_PYTHON = sys.executable
os.environ.setdefault("PYSPARK_PYTHON", VENV_PYTHON)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", VENV_PYTHON)
# The repository's jars (what the Makefile exports), also for `pytest` run from elsewhere or without make.
os.environ.setdefault("FRAUDRULES_JARS", str(Path(__file__).resolve().parents[1] / ".jars" / "spark"))


CATALOG_SCHEMA = "fraudrules_tests"


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    """With a local catalog, where tests write catalog tables through Spark's Delta writer as the bundle does."""
    from fraudrules.config import JobConfig
    from fraudrules.session import get_spark

    catalog = JobConfig(data_dir=str(tmp_path_factory.mktemp("spark")), catalog="spark_catalog", schema=CATALOG_SCHEMA)
    session = get_spark("fraudrules-tests", cfg=catalog)
    yield session
    session.stop()
