"""`dag.test()` of fraud_maintenance (target local) on a copy of a real backtest's tables: `fraudrules maintain` of the
job environment runs, its per-table lines reach the task log and the XCom, and every table is still readable with
the same rows."""

from __future__ import annotations

import shutil

import pytest
from deltalake import DeltaTable

from fraudrules.config import JOB_TABLES
from tests.support.airflow_support import dag_test, needs_airflow

pytestmark = [pytest.mark.e2e, needs_airflow]


def test_maintenance_dag_maintains_every_table(backtest_data, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(backtest_data, data)
    rows = {name: DeltaTable(str(data / "tables" / name)).count() for name in JOB_TABLES}
    out, log = dag_test("fraud_maintenance", {"target": "local", "data_dir": str(data)})
    assert out["state"] == "success", log[-6000:]
    assert out["tasks"] == {"route": "success", "maintain": "success", "run_on_databricks": "skipped"}
    lines = out["xcom"]["maintain.return_value"]
    assert lines[0].startswith(f"maintaining {len(JOB_TABLES)} tables in {data}/tables")
    assert {line.split()[0] for line in lines[1:-1]} == set(JOB_TABLES)
    assert "files" in log and "Traceback" not in log
    assert {name: DeltaTable(str(data / "tables" / name)).count() for name in JOB_TABLES} == rows
