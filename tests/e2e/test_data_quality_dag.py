"""`dag.test()` of fraud_data_quality on the tables of a real backtest: passes; on a corrupted copy it fails
naming each broken invariant (alert below its limit, stale and orphaned state entries, duplicate id)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from fraudrules.ops.delta_log import read_newest
from tests.support.airflow_support import JOB_PYTHON, REPO, dag_test, last_json, needs_airflow
from tests.support.real_tables import job_env

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.spark,
    needs_airflow,
    pytest.mark.skipif(shutil.which("java") is None, reason="needs a JVM"),
]


def _quality_reports(data_dir: Path) -> list[dict]:
    reports = sorted((data_dir / "dq" / "reports").glob("dq-*.json"), key=os.path.getmtime)
    return [json.loads(p.read_text()) for p in reports]


def test_quarantine_suite_knows_every_reason(backtest_data):
    """The suite's transaction reasons are exactly what ingest.parse() produces (the backtest hit every one)."""
    quarantine = read_newest(backtest_data / "tables" / "quarantine", ["kind", "reason"], max_files=1000)
    assert set(quarantine["kind"]) == {"transaction"}
    suite = json.loads((REPO / "expectations" / "quarantine.json").read_text())
    (pairs,) = [
        e["kwargs"]["value_pairs_set"]
        for e in suite["expectations"]
        if e["type"] == "expect_column_pair_values_to_be_in_set"
    ]
    assert set(quarantine["reason"]) == {reason for kind, reason in pairs if kind == "transaction"}


def test_quality_dag_passes_on_real_tables(backtest_data):
    out, log = dag_test("fraud_data_quality", {"data_dir": str(backtest_data)})
    assert out["state"] == "success", log[-6000:]
    result = out["xcom"]["validate.return_value"]
    assert result["success"] is True
    assert result["rows"]["alerts"] > 0 and result["rows"]["window_state"] > 0
    assert result["rows"]["quarantine"] == 17
    assert Path(result["docs_index"]).is_file()
    assert Path(result["docs_index"]).parent == backtest_data / "dq" / "docs"
    report = _quality_reports(backtest_data)[-1]
    assert report["success"] and not report["failed"]
    assert any("window_state: state of evaluate batch" in note for note in report["notes"])
    assert (backtest_data / "tables" / "dq_results" / "_delta_log").is_dir()
    results = read_newest(backtest_data / "tables" / "dq_results", ["runId", "success"], max_files=100)
    assert len(results) == len(report["outcomes"]) and results["success"].all()


def test_quality_dag_fails_naming_each_broken_invariant(backtest_data, tmp_path):
    corrupted = tmp_path / "corrupted"
    done = last_json(
        [str(JOB_PYTHON), "-m", "tests.support.dq_corrupt", str(backtest_data), str(corrupted)],
        cwd=str(REPO),
        env=job_env(),
    )

    out, log = dag_test("fraud_data_quality", {"data_dir": str(corrupted)})
    assert out["state"] == "failed"
    assert out["tasks"] == {"locate": "success", "validate": "failed"}  # failed, not up_for_retry
    expected = {
        "alerts: expect_column_values_to_be_in_set(satisfies_rule)",
        "transactions: expect_column_values_to_be_unique(transactionId)",
        "window_state: expect_column_values_to_be_in_set(within_retention)",
        "window_state: expect_column_values_to_be_in_set(rule_active)",
    }
    report = _quality_reports(corrupted)[-1]
    assert set(report["failed"]) == expected
    assert report["failed_tables"] == ["alerts", "transactions", "window_state"]
    assert "data quality FAILED on alerts, transactions, window_state" in log
    for label in expected:  # the task's failure names each one
        assert label in log, f"{label} not in the DAG's output"
    failures = {o["label"]: o for o in report["outcomes"] if not o["success"]}
    assert failures["alerts: expect_column_values_to_be_in_set(satisfies_rule)"]["unexpected_count"] == 1
    assert failures["transactions: expect_column_values_to_be_unique(transactionId)"]["unexpected_count"] == 2
    assert (
        str(done["transactionId"])
        in failures["transactions: expect_column_values_to_be_unique(transactionId)"]["sample"]
    )
    assert failures["window_state: expect_column_values_to_be_in_set(within_retention)"]["unexpected_count"] > 0
    assert failures["window_state: expect_column_values_to_be_in_set(rule_active)"]["unexpected_count"] > 0
