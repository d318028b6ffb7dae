"""A data dir left by the previous release (tables, checkpoints, state, an outbox holding micro-batches not yet in
Delta: `tests/fixtures/upgrade-<commit>.tar.gz`, made by `tools/upgrade_fixture.py`) is resumed by this release over
more input, with the alerts of one backtest of all of it: nothing lost, nothing twice. Bronze holds every record once,
and each quarantine row points at its line, whichever release counted it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from fraudrules import tables
from fraudrules.config import JobConfig
from tools.support import upgrade

ALERT = ["alertId", "ruleId", "ruleVersion", "key", "aggregate", "eventTimeMs"]


def table(data_dir: Path, name: str) -> DeltaTable:
    return DeltaTable(JobConfig(data_dir=str(data_dir)).table(name))


def alerts(data_dir: Path) -> Counter:
    return Counter(tuple(r.values()) for r in table(data_dir, "alerts").to_pyarrow_table(columns=ALERT).to_pylist())


@pytest.fixture
def released():
    """The fixture unpacked where it was made; removed afterwards."""
    manifest = upgrade.unpack()
    yield manifest
    shutil.rmtree(upgrade.ROOT, ignore_errors=True)


@pytest.mark.e2e
def test_the_previous_release_data_dir_resumes_with_every_alert_once(released):
    assert released["commit"] == upgrade.COMMIT
    assert upgrade.pending() == released["outbox_pending"] != []  # what the crash left for the next start to commit
    before = alerts(upgrade.DATA_DIR)
    upgrade.write_part(1)

    job = upgrade.run_job("--max-records-per-trigger", "300")
    assert job.wait(timeout=900) == 0, (upgrade.ROOT / "run.log").read_text()[-4000:]
    assert upgrade.pending() == []

    cfg = JobConfig(data_dir=str(upgrade.DATA_DIR))
    backtest = upgrade.ROOT / "backtest"
    cmd = [sys.executable, "-m", "fraudrules.cli", "backtest", "--transactions", cfg.landing]
    cmd += ["--logins", cfg.logins_landing, "--rules", str(upgrade.rules_file()), "--shards", upgrade.SHARDS]
    cmd += ["--out", str(upgrade.ROOT / "backtest.jsonl"), "--data-dir", str(backtest)]
    res = subprocess.run(cmd, env=upgrade.job_env(), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]

    resumed, expected = alerts(upgrade.DATA_DIR), alerts(backtest)
    assert {r[0] for r in expected} >= {r[0] for r in before} and len(expected) > len(before) > 0
    assert resumed == expected  # the same alerts, each once

    bronze = table(upgrade.DATA_DIR, "transactions").to_pyarrow_table(columns=["srcName", "srcPos"]).to_pylist()
    assert (
        len({(r["srcName"], r["srcPos"]) for r in bronze})
        == len(bronze)
        == len(upgrade.TRANSACTIONS.read_bytes().splitlines())
    )

    # the released job's quarantine rows count lines from 0, this one's from 1: the table says since when
    quarantine = table(upgrade.DATA_DIR, "quarantine")
    since = datetime.fromisoformat(quarantine.metadata().configuration[tables.LINES_FROM_1])
    rows = quarantine.to_pyarrow_table(columns=["srcName", "srcPos", "quarantinedAt", "raw"])
    rows = rows.set_column(3, "raw", rows.column("raw").cast(pa.binary())).to_pylist()  # some not UTF-8
    earlier = [r["quarantinedAt"] < since for r in rows]
    assert 0 < sum(earlier) < len(rows)
    for row, counted_from_0 in zip(rows, earlier, strict=True):
        assert source_lines(row["srcName"])[row["srcPos"] - 1 + counted_from_0] == row["raw"], row


def source_lines(name: str) -> list[bytes]:
    """The lines of a local file that rows name by URI."""
    return Path(unquote(name.removeprefix("file:"))).read_bytes().split(b"\n")
