"""Runs inside the Airflow environment (.venv-airflow), started by the tests of the job environment.

    python tests/airflow_runner.py dagbag                  # DagBag of dags/: errors, tags, retries (JSON)
    python tests/airflow_runner.py imports FILE            # modules importing FILE pulls in beyond airflow.sdk
    python tests/airflow_runner.py test DAG_ID CONF_JSON   # dag.test(run_conf=...): states and XComs (JSON)

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
                "tasks": {t.task_id: {"retries": t.retries, "owner": t.owner} for t in dag.tasks},
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


def main(argv: list[str]) -> int:
    command = argv[0]
    if command == "dagbag":
        out = dagbag()
    elif command == "imports":
        out = imports(argv[1])
    elif command == "test":
        out = test(argv[1], json.loads(argv[2]))
    else:
        raise SystemExit(f"unknown command {command}")
    sys.stdout.flush()
    print("\n" + json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
