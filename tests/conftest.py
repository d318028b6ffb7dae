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


@pytest.fixture(scope="session")
def spark():
    from fraudrules.session import get_spark

    session = get_spark("fraudrules-tests")
    yield session
    session.stop()
