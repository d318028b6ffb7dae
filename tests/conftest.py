"""Shared fixtures: one local Spark session (with Delta and RocksDB) for the integration tier."""

from __future__ import annotations

import os
import sys

import pytest

VENV_PYTHON = sys.executable
os.environ.setdefault("PYSPARK_PYTHON", VENV_PYTHON)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", VENV_PYTHON)


@pytest.fixture(scope="session")
def spark():
    from fraudrules.session import get_spark

    session = get_spark("fraudrules-tests", shuffle_partitions=2)
    yield session
    session.stop()
