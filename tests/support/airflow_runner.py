"""Runs inside the Airflow environment (.venv-airflow), started by the tests of the job environment.

    python tests/airflow_runner.py dagbag                  # DagBag of dags/: errors, tags, retries (JSON)
    python tests/airflow_runner.py imports FILE            # modules importing FILE pulls in beyond airflow.sdk
    python tests/airflow_runner.py test DAG_ID CONF_JSON   # dag.test(run_conf=...): states and XComs (JSON)
    python tests/airflow_runner.py test-databricks DAG_ID CONF_JSON WORKSPACE_JSON
        # the same with Databricks' REST API faked where the provider's own tests fake it (the `requests` module of
        # its base hook): WORKSPACE_JSON = {"jobs": [job, ...], "result_state": "SUCCESS" | "FAILED"}; adds the
        # calls the hook made (method, endpoint, payload)

The last line of stdout is the JSON answer. AIRFLOW_HOME, AIRFLOW__CORE__DAGS_FOLDER etc. come from the
caller's environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys


def dagbag() -> dict:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    return {
        "import_errors": {str(k): str(v) for k, v in bag.import_errors.items()},
        "dags": {
            dag_id: {
                "tags": sorted(dag.tags),
                "fileloc": dag.fileloc,
                "params": sorted(dag.params.keys()),
                "max_active_runs": dag.max_active_runs,
                "catchup": dag.catchup,
                "tasks": {
                    t.task_id: {
                        "retries": t.retries,
                        "owner": t.owner,
                        "operator": type(t).__name__,
                        "on_failure": [type(c).__name__ for c in t.on_failure_callback or []],
                        "extra_links": sorted(link.name for link in t.operator_extra_links),
                        "deferrable": getattr(t, "deferrable", None),
                    }
                    for t in dag.tasks
                },
            }
            for dag_id, dag in bag.dags.items()
        },
    }


def imports(path: str) -> dict:
    import importlib.util

    import airflow.sdk  # noqa: F401 - the baseline a DAG file always needs

    for name in ("dag", "task", "Param"):  # resolve the lazy attributes the DAG files use
        getattr(sys.modules["airflow.sdk"], name)
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("dag_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {"new_modules": sorted(set(sys.modules) - before)}


def test(dag_id: str, conf: dict) -> dict:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    bag = DagBag(dag_folder=os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    dag = bag.get_dag(dag_id)
    run = dag.test(run_conf=conf)
    out: dict = {"state": str(run.state), "tasks": {}, "xcom": {}}
    with create_session() as session:
        for ti in run.get_task_instances(session=session):
            out["tasks"][ti.task_id] = str(ti.state)
        rows = session.query(XComModel).filter(XComModel.dag_id == dag_id, XComModel.run_id == run.run_id).all()
        for row in rows:
            value = row.value
            if isinstance(value, str):
                with contextlib.suppress(ValueError):
                    value = json.loads(value)
            out["xcom"][f"{row.task_id}.{row.key}"] = value
    return out


class FakeResponse:
    def __init__(self, body: dict, status_code: int = 200):
        self.body, self.status_code = body, status_code
        self.text = self.content = json.dumps(body)

    def json(self) -> dict:
        return self.body

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            import requests

            raise requests.exceptions.HTTPError(response=self)


class FakeWorkspace:
    """Databricks' Jobs API as the provider's hook reaches it through `requests`: its jobs, runs that end at once
    with `result_state`, and every call made."""

    RUN_ID = 99

    def __init__(self, jobs: list[dict], result_state: str = "SUCCESS"):
        self.jobs, self.result_state, self.calls = jobs, result_state, []

    def _answer(self, method: str, url: str, payload: dict | None) -> FakeResponse:
        endpoint = url.split("/api/", 1)[1]
        self.calls.append([method, endpoint, payload])
        run = {
            "run_id": self.RUN_ID,
            "job_id": self.jobs[0]["job_id"] if self.jobs else None,
            "run_page_url": f"https://workspace.example/jobs/runs/{self.RUN_ID}",
            "state": {"life_cycle_state": "TERMINATED", "result_state": self.result_state, "state_message": ""},
            "tasks": [{"run_id": 100, "task_key": "quality", "state": {"result_state": self.result_state}}],
        }
        answers = {
            ("GET", "2.2/jobs/list"): lambda: {
                "jobs": [j for j in self.jobs if j["settings"]["name"] == payload["name"]]
            },
            ("POST", "2.2/jobs/run-now"): lambda: {"run_id": self.RUN_ID},
            ("GET", "2.2/jobs/runs/get"): lambda: run,
            ("GET", "2.2/jobs/runs/get-output"): lambda: {"error": "data quality FAILED on alerts"},
            ("POST", "2.2/jobs/update"): dict,
            ("POST", "2.2/jobs/runs/cancel-all"): dict,
        }
        if (method, endpoint) not in answers:
            return FakeResponse({"error_code": "NOT_FOUND", "message": endpoint}, 404)
        return FakeResponse(answers[(method, endpoint)]())

    def get(self, url, params=None, **_):
        return self._answer("GET", url, params)

    def post(self, url, json=None, **_):
        return self._answer("POST", url, json)


def test_databricks(dag_id: str, conf: dict, workspace: dict) -> dict:
    """`test` with the Databricks REST API faked at the provider's own seam (its base hook's `requests`)."""
    from unittest import mock

    fake = FakeWorkspace(workspace["jobs"], workspace.get("result_state", "SUCCESS"))
    with mock.patch("airflow.providers.databricks.hooks.databricks_base.requests", fake):
        out = test(dag_id, conf)
    return {**out, "calls": fake.calls}


def main(argv: list[str]) -> int:
    # As Airflow 3's DAG processor and task runner do for a bundle: its root (the DAGs folder) is importable.
    sys.path.append(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
    command = argv[0]
    if command == "dagbag":
        out = dagbag()
    elif command == "imports":
        out = imports(argv[1])
    elif command == "test":
        out = test(argv[1], json.loads(argv[2]))
    elif command == "test-databricks":
        out = test_databricks(argv[1], json.loads(argv[2]), json.loads(argv[3]))
    else:
        raise SystemExit(f"unknown command {command}")
    sys.stdout.flush()
    print("\n" + json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
