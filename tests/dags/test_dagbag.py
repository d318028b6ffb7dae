"""The DAGs load cleanly in the Airflow environment, carry tags and retries, and import nothing heavy at top level."""

from __future__ import annotations

import pytest

from tests.support.airflow_support import DAGS, needs_airflow, run_airflow

pytestmark = [needs_airflow]

EXPECTED = {
    "fraud_stream": {"fraudrules", "streaming", "monitoring"},
    "fraud_data_quality": {"fraudrules", "data-quality"},
}
HEAVY = ("pyspark", "great_expectations", "pandas", "numpy", "pyarrow", "fraudrules", "airflow.providers.databricks")


@pytest.fixture(scope="module")
def bag() -> dict:
    return run_airflow("dagbag", timeout=300)[0]


def test_no_import_errors(bag):
    assert bag["import_errors"] == {}
    assert set(EXPECTED) <= set(bag["dags"])


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_tags_retries_and_schedule(bag, dag_id):
    dag = bag["dags"][dag_id]
    assert EXPECTED[dag_id] <= set(dag["tags"])
    assert dag["catchup"] is False
    assert dag["max_active_runs"] == 1
    assert "data_dir" in dag["params"]
    assert dag["tasks"], "a DAG without tasks"
    for task_id, task in dag["tasks"].items():
        assert task["retries"] >= 1, f"{dag_id}.{task_id} has no retries"
        assert task["owner"] == "fraud-platform"


@pytest.mark.parametrize("name", ["fraud_stream.py", "fraud_data_quality.py"])
def test_no_heavy_top_level_imports(name):
    new = run_airflow("imports", str(DAGS / name), timeout=300)[0]["new_modules"]
    heavy = [m for m in new if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
    assert heavy == [], f"importing dags/{name} pulls in {heavy}"
