"""Data quality of the fraud-rules tables and streaming state (Great Expectations), hourly - the one schedule.

The check is the committed GX project's checkpoint (`expectations/`, `fraudrules quality`); `target` says where:

- **local**: `validate` runs `fraudrules quality` of the **job environment** (where Spark and GX are), the same
  command as the bundle's job; its summary (per table what was read, checks passed and failed) goes to the task
  log; validation results, Data Docs and an offline summary page accumulate in `dq_dir` (default
  `<data_dir>/dq`). `verdict` fails, without retrying (retrying does not change the data), naming every failed
  expectation and table; a crash of the check itself (no report) is retried, a data dir it refuses is not.
- **databricks**: the provider's deferrable `DatabricksRunNowOperator` triggers the bundle's data-quality job
  (by name; it has no schedule of its own) and waits for it in the triggerer; its run page is the task's
  "See Databricks Job Run" link. The job runs the same checkpoint from the wheel and fails the same way.

A check that cannot find a table or a query's state fails with that reason. Failed tasks are recorded by the
`fraud_alerting.TaskFailed` notifier. Heavy libraries are imported by the job environment's process only.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.databricks.operators.databricks import DatabricksRunNowOperator
from airflow.sdk import Param, dag, task
from fraud_jobenv import DATA_DIR, JOB_PYTHON, TARGET, job_command, task_defaults

default_args = task_defaults(timedelta(minutes=2), timedelta(minutes=45))


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
        # as `fraudrules run` has them by default (its state is read with the same shard layout)
        "shards": Param(1, type="integer", minimum=1, description="local: the job's state groups"),
        "shuffle_partitions": Param(1, type="integer", minimum=1, description="local: the job's state partitions"),
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

    @task
    def validate(where: dict, params: dict | None = None) -> dict:
        """`fraudrules quality` of the job environment; its report's summary (exit 1: checks failed, still a report;
        exit 2: it refused the data dir, which a retry does not change)."""
        import json
        import tempfile

        from airflow.sdk.exceptions import AirflowFailException

        p = params or {}
        options = {k: str(p[k]) for k in ("shards", "shuffle_partitions", "lateness_ms", "max_age_minutes")}
        with tempfile.TemporaryDirectory(prefix="fraudrules-dq-") as tmp:
            report = os.path.join(tmp, "report.json")
            args = ["--data-dir", where["data_dir"], "--dq-dir", where["dq_dir"], "--report", report]
            args += [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
            code, _, tail = job_command(p["job_python"], "fraudrules.cli", "quality", *args, timeout=1800)
            if code == 2:
                raise AirflowFailException(tail.strip().splitlines()[-1] if tail.strip() else "quality refused")
            if code not in (0, 1) or not os.path.exists(report):
                raise RuntimeError(f"fraudrules quality failed ({code}) without a report:\n{tail[-3000:]}")
            with open(report, encoding="utf-8") as fh:
                found = json.load(fh)
        return {k: v for k, v in found.items() if k not in ("notes", "outcomes")}

    @task(retries=0)
    def verdict(report: dict) -> dict:
        """Fail (no retry) naming each failed expectation and table; else what was checked."""
        from airflow.sdk.exceptions import AirflowFailException

        print(f"Data Docs: {report['docs_index']}")
        if not report["success"]:
            raise AirflowFailException(f"{report['message']}\nData Docs: {report['docs_index']}")
        return {k: report[k] for k in ("success", "rows", "read", "docs_index", "report")}

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
    verdict(validate(where))


DAG = fraud_data_quality()
