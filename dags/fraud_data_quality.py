"""Data quality of the fraud-rules tables (Great Expectations), hourly.

Runs `fraudrules quality` of the **job environment** (where Spark and Great Expectations are),
as a production deployment would: the Airflow worker only starts it and reads its JSON report. The run
fails, without retrying (retrying does not change the data), naming every failed expectation and table;
a crash of the check itself (no report) is retried. Data Docs are written to `docs_dir`
(default `<data_dir>/dq/docs`), results appended to the `dq_results` Delta table. A suite whose table or state
(the evaluate query's checkpoint) is missing fails with that reason.

Heavy libraries are imported by the job environment's process only, never by this file.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, task

REPO = Path(__file__).resolve().parents[1]
JOB_PYTHON = os.environ.get("FRAUDRULES_JOB_PYTHON", str(REPO / ".venv" / "bin" / "python"))
DATA_DIR = os.environ.get("FRAUDRULES_DATA_DIR", str(REPO / "data"))

default_args = {
    "owner": "fraud-platform",
    "retries": 2,
    "retry_delay": timedelta(minutes=2),
    "execution_timeout": timedelta(minutes=30),
}


def _job_env(job_python: str) -> dict:
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", job_python)
    env.setdefault("PYSPARK_DRIVER_PYTHON", job_python)
    env["GX_ANALYTICS_ENABLED"] = "False"
    return env


@dag(
    dag_id="fraud_data_quality",
    description="Great Expectations suites over alerts, window state, bronze, quarantine, rules",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=default_args,
    tags=["fraudrules", "data-quality", "great-expectations"],
    doc_md=__doc__,
    params={
        "data_dir": Param(DATA_DIR, type="string", description="root of the job's Delta tables and checkpoints"),
        "docs_dir": Param("", type="string", description="Data Docs folder (empty: <data_dir>/dq/docs)"),
        "job_python": Param(JOB_PYTHON, type="string", description="python of the job environment"),
        "suites": Param(
            "transactions,quarantine,rules,alerts,window_state,late_events",
            type="string",
            description="comma-separated tables to check (one suite each in expectations/)",
        ),
        "lateness_ms": Param(60_000, type="integer", minimum=0, description="the job's allowed lateness"),
        "shards": Param(16, type="integer", minimum=1, description="the job's state groups"),
        "timeout_s": Param(1_800, type="integer", minimum=60),
    },
)
def fraud_data_quality():
    @task
    def locate(params: dict | None = None) -> dict:
        """Resolve the paths of this run and check that there is something to check."""
        p = params or {}
        data_dir = os.path.abspath(p["data_dir"])
        if not os.path.isfile(p["job_python"]):
            raise FileNotFoundError(f"job environment python {p['job_python']} not found: run `make setup`")
        if not os.path.isdir(os.path.join(data_dir, "tables")):
            from airflow.sdk.exceptions import AirflowFailException

            raise AirflowFailException(f"no tables under {data_dir}: nothing to check (has the job run?)")
        docs_dir = os.path.abspath(p["docs_dir"] or os.path.join(data_dir, "dq", "docs"))
        return {"data_dir": data_dir, "docs_dir": docs_dir, "job_python": p["job_python"]}

    @task
    def validate(where: dict, params: dict | None = None) -> dict:
        """Run the suites in the job environment; fail naming each failed expectation and table."""
        import json
        import subprocess
        import tempfile

        from airflow.sdk.exceptions import AirflowFailException

        p = params or {}
        report_dir = os.path.join(where["data_dir"], "dq", "reports")
        os.makedirs(report_dir, exist_ok=True)
        fd, report_path = tempfile.mkstemp(prefix="dq-", suffix=".json", dir=report_dir)
        os.close(fd)
        cmd = [
            where["job_python"],
            "-m",
            "fraudrules.cli",
            "quality",
            "--data-dir",
            where["data_dir"],
            "--docs-dir",
            where["docs_dir"],
            "--report",
            report_path,
            "--suites",
            p["suites"],
            "--lateness-ms",
            str(p["lateness_ms"]),
            "--shards",
            str(p["shards"]),
        ]
        print("running:", " ".join(cmd))
        proc = subprocess.run(
            cmd,
            env=_job_env(where["job_python"]),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=p["timeout_s"],
            check=False,
        )
        lines = [ln for ln in proc.stdout.splitlines() if "[Stage " not in ln]
        print("\n".join(lines[-60:]))
        report = None
        if os.path.getsize(report_path):
            with open(report_path, encoding="utf-8") as fh:
                report = json.load(fh)
        if report is None:
            raise RuntimeError(f"the quality check crashed (exit {proc.returncode}) before reporting")
        print(f"Data Docs: {report['docs_index']}")
        if not report["success"]:
            raise AirflowFailException(f"{report['message']}\nData Docs: {report['docs_index']}")
        return {
            "success": True,
            "rows": report["rows"],
            "expectations": len(report["outcomes"]),
            "docs_index": report["docs_index"],
            "report": report_path,
        }

    validate(locate())


DAG = fraud_data_quality()
