"""Data quality of the fraud-rules tables and streaming state (Great Expectations), hourly - the one schedule.

The check is the committed GX project's checkpoint (`expectations/`, `fraudrules quality`); `target` says where:

- **local**: `validate` runs `fraudrules.ops.quality` in the **job environment** (where Spark and GX are) with
  `@task.external_python`, its output streamed to the task log as it runs; validation results and Data Docs
  accumulate in `dq_dir` (default `<data_dir>/dq`). `verdict` fails, without retrying (retrying does not change
  the data), naming every failed expectation and table; a crash of the check itself (no report) is retried.
- **databricks**: the provider's deferrable `DatabricksRunNowOperator` triggers the bundle's data-quality job
  (by name; it has no schedule of its own) and waits for it in the triggerer; its run page is the task's
  "See Databricks Job Run" link. The job runs the same checkpoint from the wheel and fails the same way.

A check that cannot find a table or a query's state fails with that reason. Failed tasks are recorded by the
`fraud_alerting.TaskFailed` notifier. Heavy libraries are imported by the job environment's process only.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.providers.databricks.operators.databricks import DatabricksRunNowOperator
from airflow.sdk import Param, dag, task
from fraud_alerting import TaskFailed

REPO = Path(__file__).resolve().parents[1]
JOB_PYTHON = os.environ.get("FRAUDRULES_JOB_PYTHON", str(REPO / ".venv" / "bin" / "python"))
DATA_DIR = os.environ.get("FRAUDRULES_DATA_DIR", str(REPO / "data"))
TARGET = os.environ.get("FRAUDRULES_TARGET", "local")

default_args = {
    "owner": "fraud-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(minutes=45),
    "on_failure_callback": [TaskFailed()],
}


@dag(
    dag_id="fraud_data_quality",
    description="Great Expectations checkpoint over bronze, quarantine, rules, alerts, late events and state",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=default_args,
    tags=["fraudrules", "data-quality", "great-expectations"],
    doc_md=__doc__,
    params={
        "target": Param(TARGET, enum=["local", "databricks"], description="where the check runs"),
        "data_dir": Param(DATA_DIR, type="string", description="local: root of the job's tables and checkpoints"),
        "dq_dir": Param("", type="string", description="local: results and Data Docs (empty: <data_dir>/dq)"),
        "job_python": Param(JOB_PYTHON, type="string", description="local: python of the job environment"),
        "lateness_ms": Param(60_000, type="integer", minimum=0, description="local: the job's allowed lateness"),
        "shards": Param(2, type="integer", minimum=1, description="local: the job's state groups"),
        "shuffle_partitions": Param(2, type="integer", minimum=1, description="local: the job's state partitions"),
        "max_age_minutes": Param(60, type="number", minimum=0, description="freshness of bronze and alerts"),
        "databricks_conn_id": Param("databricks_default", type="string"),
        "databricks_job_name": Param("fraudrules-data-quality", type="string", description="the bundle's DQ job"),
    },
)
def fraud_data_quality():
    @task.branch
    def route(params: dict | None = None) -> str:
        """The local check, or the bundle's job on Databricks."""
        return "run_on_databricks" if (params or {})["target"] == "databricks" else "locate"

    @task
    def locate(params: dict | None = None) -> dict:
        """Resolve the paths of this run and check that there is something to check."""
        from airflow.sdk.exceptions import AirflowFailException

        p = params or {}
        data_dir = os.path.abspath(p["data_dir"])
        if not os.path.isfile(p["job_python"]):
            raise FileNotFoundError(f"job environment python {p['job_python']} not found: run `make setup`")
        if not os.path.isdir(os.path.join(data_dir, "tables")):
            raise AirflowFailException(f"no tables under {data_dir}: nothing to check (has the job run?)")
        return {"data_dir": data_dir, "dq_dir": os.path.abspath(p["dq_dir"] or os.path.join(data_dir, "dq"))}

    @task.external_python(python="{{ params.job_python }}", expect_airflow=False)
    def validate(where: dict, engine: dict) -> dict:
        """The checkpoint, in the job environment (this function's source runs there); its report."""
        from fraudrules.config import config_from
        from fraudrules.ops import quality
        from fraudrules.session import get_spark

        cfg = config_from({"data_dir": where["data_dir"], **engine})
        spark = get_spark("fraudrules-quality", short_lived=True, cfg=cfg)
        try:
            report = quality.run(spark, cfg, where["dq_dir"], max_age_minutes=float(engine["max_age_minutes"]))
        finally:
            spark.stop()
        for note in report.notes:
            print(note)
        print(report.message())
        return report.summary()

    @task(retries=0)
    def verdict(report: dict) -> dict:
        """Fail (no retry) naming each failed expectation and table; else what was checked."""
        from airflow.sdk.exceptions import AirflowFailException

        print(f"Data Docs: {report['docs_index']}")
        if not report["success"]:
            raise AirflowFailException(f"{report['message']}\nData Docs: {report['docs_index']}")
        return {k: report[k] for k in ("success", "rows", "read", "docs_index", "report")}

    engine = {
        "shards": "{{ params.shards }}",
        "shuffle_partitions": "{{ params.shuffle_partitions }}",
        "lateness_ms": "{{ params.lateness_ms }}",
        "max_age_minutes": "{{ params.max_age_minutes }}",
    }
    on_databricks = DatabricksRunNowOperator(
        task_id="run_on_databricks",
        databricks_conn_id="{{ params.databricks_conn_id }}",
        job_name="{{ params.databricks_job_name }}",
        deferrable=True,
        forward_dag_params=False,  # the DAG's params are this DAG's, not the job's
        retries=0,  # a failed check is the data's fault; the run page says why
    )
    where = locate()
    route() >> [where, on_databricks]
    verdict(validate(where, engine))


DAG = fraud_data_quality()
