"""Fixtures of the end-to-end tier."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.support.real_tables import real_backtest


@pytest.fixture(scope="session")
def backtest_data(tmp_path_factory) -> Path:
    """Tables and checkpoints of one real backtest (tools/support/real_tables.py), read by several tests."""
    return real_backtest(tmp_path_factory.mktemp("dq"))
