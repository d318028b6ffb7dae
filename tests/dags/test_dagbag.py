"""The DAGs load cleanly in the Airflow environment, carry tags, retries and the failure notifier, use the
Databricks provider's operators for their databricks targets, and import nothing heavy at top level."""

from __future__ import annotations

import pytest

from tests.support.airflow_support import DAGS, needs_airflow, run_airflow

pytestmark = [needs_airflow]

EXPECTED = {
    "fraud_stream": {"fraudrules", "streaming", "monitoring"},
    "fraud_data_quality": {"fraudrules", "data-quality"},
    "fraud_maintenance": {"fraudrules", "maintenance"},
}
NO_RETRY = {("fraud_data_quality", "verdict"), ("fraud_data_quality", "run_on_databricks")}  # the data's fault
HEAVY = ("pyspark", "great_expectations", "pandas", "numpy", "pyarrow", "fraudrules", "databricks.sql")


@pytest.fixture(scope="module")
def bag() -> dict:
    return run_airflow("dagbag", timeout=300)[0]


def test_no_import_errors(bag):
    assert bag["import_errors"] == {}
    assert set(EXPECTED) <= set(bag["dags"])


@pytest.mark.parametrize("dag_id", sorted(EXPECTED))
def test_tags_retries_notifier_and_schedule(bag, dag_id):
    dag = bag["dags"][dag_id]
    assert EXPECTED[dag_id] <= set(dag["tags"])
    assert dag["catchup"] is False
    assert dag["max_active_runs"] == 1
    assert {"data_dir", "target"} <= set(dag["params"])
    assert dag["tasks"], "a DAG without tasks"
    for task_id, task in dag["tasks"].items():
        if (dag_id, task_id) in NO_RETRY:
            assert task["retries"] == 0, f"{dag_id}.{task_id} retries what a retry cannot fix"
        else:
            assert task["retries"] >= 1, f"{dag_id}.{task_id} has no retries"
        assert task["owner"] == "fraud-platform"
        assert task["on_failure"] == ["TaskFailed"], f"{dag_id}.{task_id} fails silently"


def test_databricks_targets_use_the_providers_operators(bag):
    quality = bag["dags"]["fraud_data_quality"]["tasks"]["run_on_databricks"]
    assert quality["operator"] == "DatabricksRunNowOperator" and quality["deferrable"] is True
    assert quality["extra_links"] == ["See Databricks Job Run"]
    start = bag["dags"]["fraud_stream"]["tasks"]["start_databricks"]
    assert start["operator"] == "DatabricksRunNowOperator" and start["extra_links"] == ["See Databricks Job Run"]
    assert bag["dags"]["fraud_data_quality"]["tasks"]["validate"]["operator"] == "_PythonDecoratedOperator"


@pytest.mark.parametrize("name", ["fraud_stream.py", "fraud_data_quality.py", "fraud_maintenance.py"])
def test_no_heavy_top_level_imports(name):
    new = run_airflow("imports", str(DAGS / name), timeout=300)[0]["new_modules"]
    heavy = [m for m in new if m.split(".")[0] in HEAVY or m.startswith(HEAVY)]
    assert heavy == [], f"importing dags/{name} pulls in {heavy}"


def test_no_private_hook_calls():
    """The DAGs drive Databricks through the provider's public API and operators only."""
    for path in DAGS.glob("*.py"):
        assert "._do_api_call" not in path.read_text(), path.name
