"""Table maintenance of the fraud-rules tables, daily, while the job runs: compaction, VACUUM and the Delta log
(`fraudrules maintain`; docs/operations.md#table-maintenance).

The job's writers compact the tables they append to as they go, and its ingest queries delete bronze rows past their
retention; this DAG does what only a schedule should: it vacuums the files no version within the retention needs,
checkpoints the Delta log and removes its expired entries, and compacts whatever the writers left. `target` says
where:

- **local**: `maintain` runs `fraudrules maintain` of the **job environment** on `data_dir`; its per-table lines
  (files, bytes and log entries before and after, rows expired, files vacuumed, time taken) go to the task log.
- **databricks**: the provider's deferrable `DatabricksRunNowOperator` triggers the bundle's maintenance job (by
  name; it has no schedule of its own) and waits for it in the triggerer.

Every step is a Delta commit the job's own appends do not conflict with or retry after, so nothing stops the job.
A failed run is retried: maintenance that did not happen today is done by the next run.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.databricks.operators.databricks import DatabricksRunNowOperator
from airflow.sdk import Param, dag, task
from fraud_jobenv import DATA_DIR, JOB_PYTHON, TARGET, job_command, task_defaults

default_args = task_defaults(timedelta(minutes=10), timedelta(hours=2))


@dag(
    dag_id="fraud_maintenance",
    description="Delta maintenance of the job's tables: compaction, VACUUM, log cleanup",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=default_args,
    tags=["fraudrules", "maintenance", "delta"],
    doc_md=__doc__,
    params={
        "target": Param(TARGET, enum=["local", "databricks"], description="where the maintenance runs"),
        "data_dir": Param(DATA_DIR, type="string", description="local: root of the job's tables"),
        "job_python": Param(JOB_PYTHON, type="string", description="local: python of the job environment"),
        "retention_hours": Param(168, type="number", minimum=0, description="VACUUM keeps removed files this long"),
        "log_retention_days": Param(30, type="number", minimum=0, description="the Delta log keeps entries this long"),
        "databricks_conn_id": Param("databricks_default", type="string"),
        "databricks_job_name": Param("fraudrules-maintenance", type="string", description="the bundle's job"),
    },
)
def fraud_maintenance():
    @task.branch
    def route(params: dict | None = None) -> str:
        """The local maintenance, or the bundle's job on Databricks."""
        return "run_on_databricks" if (params or {})["target"] == "databricks" else "maintain"

    @task
    def maintain(params: dict | None = None) -> list[str]:
        """`fraudrules maintain` of the job environment: its per-table lines (exit 2: it refused the data dir,
        which a retry does not change)."""
        from airflow.sdk.exceptions import AirflowFailException

        p = params or {}
        args = ["--data-dir", os.path.abspath(p["data_dir"])]
        args += [f"--{k.replace('_', '-')}={p[k]}" for k in ("retention_hours", "log_retention_days")]
        code, out, tail = job_command(p["job_python"], "fraudrules.cli", "maintain", *args, timeout=7200)
        if code == 2:
            raise AirflowFailException(tail.strip().splitlines()[-1] if tail.strip() else "maintain refused")
        if code != 0:
            raise RuntimeError(f"fraudrules maintain failed ({code}):\n{tail[-3000:]}")
        return out.strip().splitlines()

    on_databricks = DatabricksRunNowOperator(
        task_id="run_on_databricks",
        databricks_conn_id="{{ params.databricks_conn_id }}",
        job_name="{{ params.databricks_job_name }}",
        deferrable=True,
        forward_dag_params=False,  # the DAG's params are this DAG's, not the job's
    )
    route() >> [maintain(), on_databricks]


DAG = fraud_maintenance()
