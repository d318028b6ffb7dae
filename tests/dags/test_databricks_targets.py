"""The DAGs' databricks targets, run with `dag.test()` against the provider's own operators and hook, with only
Databricks' REST API faked, where the provider's tests fake it (tests/support/airflow_runner.py FakeWorkspace)."""

from __future__ import annotations

import pytest

from tests.support.airflow_support import alerts, dag_test_databricks, needs_airflow

pytestmark = [needs_airflow]

RUN_PAGE = "https://workspace.example/jobs/runs/99"


def _job(job_id: int, name: str, continuous: dict | None = None) -> dict:
    settings = {"name": name, **({"continuous": continuous} if continuous else {})}
    return {"job_id": job_id, "settings": settings}


def _endpoints(calls: list) -> list[str]:
    return [f"{method} {endpoint}" for method, endpoint, _ in calls]


def test_quality_on_databricks_runs_the_bundle_job_by_name():
    workspace = {"jobs": [_job(7, "fraudrules-data-quality")], "result_state": "SUCCESS"}
    out, log = dag_test_databricks("fraud_data_quality", {"target": "databricks"}, workspace)
    assert out["state"] == "success", log[-4000:]
    assert out["tasks"] == {
        "route": "success",
        "run_on_databricks": "success",
        "locate": "skipped",
        "validate": "skipped",
        "verdict": "skipped",
    }
    run_now = [payload for method, endpoint, payload in out["calls"] if endpoint == "2.2/jobs/run-now"]
    assert run_now == [{"job_id": 7}]  # the job found by its name, not a hard-coded id
    assert ["GET", "2.2/jobs/list"] in [c[:2] for c in out["calls"]]
    assert out["xcom"]["run_on_databricks.run_page_url"] == RUN_PAGE


def test_a_failed_quality_job_fails_the_task_and_alerts():
    before = len(alerts())
    workspace = {"jobs": [_job(7, "fraudrules-data-quality")], "result_state": "FAILED"}
    out, log = dag_test_databricks("fraud_data_quality", {"target": "databricks"}, workspace)
    assert out["state"] == "failed"
    assert out["tasks"]["run_on_databricks"] == "failed"  # no retry: the run page says why
    assert "data quality FAILED on alerts" in log
    recorded = alerts()[before:]
    assert [(a["dag_id"], a["task_id"]) for a in recorded] == [("fraud_data_quality", "run_on_databricks")]
    assert "data quality FAILED on alerts" in recorded[0]["error"]


@pytest.mark.parametrize(
    ("job", "healer", "call"),
    [
        (_job(5, "fraudrules-streaming", {"pause_status": "PAUSED"}), "unpause_databricks", "POST 2.2/jobs/update"),
        (_job(5, "fraudrules-streaming"), "start_databricks", "POST 2.2/jobs/run-now"),
    ],
    ids=["paused-continuous", "not-continuous"],
)
def test_stream_starts_a_stopped_job(job, healer, call):
    out, log = dag_test_databricks("fraud_stream", {"target": "databricks"}, {"jobs": [job]})
    assert out["state"] == "success", log[-4000:]
    assert out["tasks"][healer] == "success"
    assert {t for t, state in out["tasks"].items() if state == "success"} == {"probe", "decide", healer, "assess"}
    assert out["xcom"]["probe.return_value"]["action"] in ("start", "unpause")
    writes = [c for c in out["calls"] if c[0] == "POST"]  # what the DAG changed in the workspace
    assert [f"POST {endpoint}" for _, endpoint, _ in writes] == [call]
    if healer == "unpause_databricks":
        assert writes[0][2] == {"job_id": "5", "new_settings": {"continuous": {"pause_status": "UNPAUSED"}}}
    else:  # the provider's operator, the job by name, not waited for: its run page is the task's link
        assert writes[0][2] == {"job_id": 5}
        assert out["xcom"]["start_databricks.run_page_url"] == RUN_PAGE


def test_stream_leaves_a_running_continuous_job_alone():
    job = _job(5, "fraudrules-streaming", {"pause_status": "UNPAUSED"})
    out, log = dag_test_databricks("fraud_stream", {"target": "databricks"}, {"jobs": [job]})
    assert out["state"] == "success", log[-4000:]
    assert out["xcom"]["probe.return_value"]["action"] == "none"
    assert out["tasks"]["assess"] == "success" and out["tasks"]["start_databricks"] == "skipped"
    assert _endpoints(out["calls"]) == ["GET 2.2/jobs/list"]
