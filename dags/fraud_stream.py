"""Keep the continuous fraud-rules job running, every 5 minutes: start it, check it, restart it.

`target` selects where the job runs; both are judged by the job environment's `fraudrules status` (the same
rules and thresholds, `fraudrules.ops.health`):

- **local**: `fraudrules status` reads the job's heartbeat (the `batches` Delta table, without a JVM), its pid
  file and its landing backlog; the job environment's local supervisor (`python -m fraudrules.ops.supervisor`) starts
  `fraudrules run` detached when it is not running, or restarts it when it runs but has committed no batch for
  `stale_after_s` while input waits (a hung job);
- **databricks**: the provider's public hook API looks up the bundle's job by name (`list_jobs`): a continuous job
  that is unpaused is kept running by Databricks itself; when a SQL warehouse is configured, the heartbeat is read
  from the `batches` table; `fraudrules status --facts -` judges those facts. A paused continuous job is unpaused
  (`update_job`), a job that is not continuous is started with the provider's `DatabricksRunNowOperator` (job by
  name, run-page link, not waited for), and a job that stopped committing has its runs cancelled
  (`cancel_all_runs`), which the continuous trigger replaces.

`decide` picks one of those actions (or none); the DAG never waits for the continuous job. A run fails, without
retrying, when the job is slow (p99 latency over `p99_threshold_ms` or rising), falls behind (`lag_threshold_s`)
or crash-loops (more than `max_restarts_per_hour` restarts); a restart that fixed a dead or hung job is a success,
logged with its reason. The job environment's commands stream their log lines into the task log as they run;
failed tasks are recorded by the `fraud_alerting.TaskFailed` notifier.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.databricks.operators.databricks import DatabricksRunNowOperator
from airflow.sdk import Param, dag, task
from fraud_jobenv import DATA_DIR, JOB_PYTHON, TARGET, job_command, task_defaults

HEALERS = {  # (target, action) -> the task that carries it out
    ("local", "start"): "heal_local",
    ("local", "restart"): "heal_local",
    ("databricks", "start"): "start_databricks",
    ("databricks", "unpause"): "unpause_databricks",
    ("databricks", "restart"): "restart_databricks",
}

default_args = task_defaults(timedelta(seconds=30), timedelta(minutes=5))


def _job_command(params: dict, module: str, *args: str, stdin: str | None = None, timeout: float = 120) -> dict:
    """`python -m <module> ...` of the job environment (`fraud_jobenv.job_command`); its last stdout line is its
    JSON answer, and a failure raises with the end of its log."""
    import json

    code, out, tail = job_command(params["job_python"], module, *args, stdin=stdin, timeout=timeout)
    if code != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed ({code}):\n{tail[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def _status(params: dict, *args: str, stdin: str | None = None) -> dict:
    """`fraudrules status` of the job environment, with the DAG's thresholds."""
    return _job_command(params, "fraudrules.cli", "status", *_thresholds(params), *args, stdin=stdin)


def _supervise(params: dict, command: str, *args: str) -> dict:
    """The local supervisor of the job environment: start / restart the job detached."""
    data_dir = os.path.abspath(params["data_dir"])
    return _job_command(params, "fraudrules.ops.supervisor", command, "--data-dir", data_dir, *args, timeout=180)


def _thresholds(params: dict) -> list[str]:
    return [
        "--stale-after-s",
        str(params["stale_after_s"]),
        "--startup-grace-s",
        str(params["startup_grace_s"]),
        "--p99-ms",
        str(params["p99_threshold_ms"]),
        "--lag-s",
        str(params["lag_threshold_s"]),
        "--max-restarts-per-hour",
        str(params["max_restarts_per_hour"]),
    ]


def _launch_args(params: dict) -> list[str]:
    args = ["--rate", str(params["rate"])]
    for extra in params.get("job_args") or []:
        args.append(f"--job-arg={extra}")  # `=`: the value may itself start with "--"
    return args


# ------------------------------------------------------------------------------------------ Databricks


def _databricks_hook(params: dict):
    from airflow.providers.databricks.hooks.databricks import DatabricksHook

    return DatabricksHook(databricks_conn_id=params["databricks_conn_id"])


def _databricks_job(hook, params: dict) -> dict:
    """The bundle's job (id and settings), by name."""
    from airflow.sdk.exceptions import AirflowFailException

    jobs = hook.list_jobs(job_name=params["databricks_job_name"])
    if not jobs:
        raise AirflowFailException(
            f"no Databricks job named {params['databricks_job_name']!r}: deploy the bundle (databricks bundle deploy)"
        )
    return jobs[0]


def _databricks_heartbeat(params: dict) -> dict | None:
    """Newest evaluate batches from the Unity Catalog `batches` table, through a SQL warehouse (if configured)."""
    import re
    import time

    table, http_path = params.get("databricks_batches_table"), params.get("databricks_sql_http_path")
    if not table or not http_path:
        return None
    if not re.fullmatch(r"[\w`]+(\.[\w`]+){0,2}", table):
        raise ValueError(f"not a table name: {table!r}")
    from airflow.providers.databricks.hooks.databricks_sql import DatabricksSqlHook

    sql = DatabricksSqlHook(databricks_conn_id=params["databricks_conn_id"], http_path=http_path)
    rows = sql.get_records(
        f"SELECT batchId, unix_millis(committedAt), latencyP99Ms FROM {table} "
        "WHERE query = 'evaluate' ORDER BY batchId DESC LIMIT 20"
    )
    if not rows:
        return {"last_commit_ms": None, "age_s": None, "p99_ms": []}
    last_ms = int(rows[0][1])
    return {
        "last_batch_id": int(rows[0][0]),
        "last_commit_ms": last_ms,
        "age_s": time.time() - last_ms / 1000,
        "p99_ms": [float(r[2]) for r in reversed(rows) if r[2] is not None],
    }


def _databricks_status(params: dict) -> dict:
    """The bundle job's state and heartbeat, judged by the job environment's `fraudrules status`.

    An unpaused continuous job is running as far as the API can say: Databricks keeps one run of it going (and
    starts the next when one fails); whether that run works is the heartbeat's to tell."""
    import json

    job = _databricks_job(_databricks_hook(params), params)
    continuous = (job.get("settings") or {}).get("continuous")
    paused = bool(continuous) and continuous.get("pause_status") == "PAUSED"
    beat = _databricks_heartbeat(params)
    runner = {
        "launched": True,  # the deployed job exists
        "alive": bool(continuous) and not paused,
        "started_at": None,
        "down": f"Databricks job {job['job_id']} is " + ("paused" if paused else "not continuous"),
    }
    verdict = _status(params, "--facts", "-", stdin=json.dumps({"runner": runner, "heartbeat": beat}))
    action = "unpause" if verdict["action"] == "start" and paused else verdict["action"]
    return {"target": "databricks", "job_id": job["job_id"], "heartbeat": beat, **verdict, "action": action}


# ------------------------------------------------------------------------------------------------ DAG


@dag(
    dag_id="fraud_stream",
    description="Start, watch and restart the continuous fraud-rules job (local or Databricks)",
    schedule=timedelta(minutes=5),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    default_args=default_args,
    tags=["fraudrules", "streaming", "monitoring"],
    doc_md=__doc__,
    params={
        "target": Param(TARGET, enum=["local", "databricks"], description="where the continuous job runs"),
        "data_dir": Param(DATA_DIR, type="string", description="local: root of the job's tables and checkpoints"),
        "job_python": Param(JOB_PYTHON, type="string", description="local: python of the job environment"),
        "rate": Param(200.0, type="number", minimum=0, description="local: generated transactions per second"),
        "job_args": Param([], type="array", description="local: extra arguments for `fraudrules run`"),
        "stale_after_s": Param(120, type="number", minimum=1, description="no batch for this long: hung"),
        "startup_grace_s": Param(180, type="number", minimum=0, description="time a fresh job gets to commit"),
        "p99_threshold_ms": Param(5_000, type="number", minimum=0, description="alert latency p99 limit"),
        "lag_threshold_s": Param(300, type="number", minimum=0, description="oldest unprocessed input limit"),
        "max_restarts_per_hour": Param(3, type="integer", minimum=0),
        "databricks_conn_id": Param("databricks_default", type="string"),
        "databricks_job_name": Param("fraudrules-streaming", type="string", description="the bundle's job"),
        "databricks_sql_http_path": Param("", type="string", description="SQL warehouse for the heartbeat"),
        "databricks_batches_table": Param("", type="string", description="catalog.schema.batches"),
    },
)
def fraud_stream():
    @task
    def probe(params: dict | None = None) -> dict:
        """Health of the job: running? heartbeat fresh? latency and lag within limits?"""
        p = params or {}
        if p["target"] == "databricks":
            health = _databricks_status(p)
        else:
            health = {"target": "local", **_status(p, "--data-dir", os.path.abspath(p["data_dir"]))}
        print(f"action: {health['action']} ({health['reason']}); problems: {health['problems'] or 'none'}")
        return health

    @task.branch
    def decide(health: dict) -> str:
        """The task that carries out the recommended action, or straight to the assessment."""
        return HEALERS.get((health["target"], health["action"]), "assess")

    @task
    def heal_local(health: dict, params: dict | None = None) -> dict:
        """Start a local job that is not running, restart one that stopped committing; never wait for it."""
        command = "start" if health["action"] == "start" else "restart"
        done = {
            "action": health["action"],
            **_supervise(params or {}, command, *_launch_args(params or {}), f"--reason={health['reason']}"),
        }
        print(f"{health['action']}ed the job: {health['reason']} -> {done}")
        return done

    @task
    def unpause_databricks(health: dict, params: dict | None = None) -> dict:
        """A paused continuous job: unpause it; Databricks starts its run."""
        hook = _databricks_hook(params or {})
        continuous = (_databricks_job(hook, params or {}).get("settings") or {}).get("continuous") or {}
        hook.update_job(str(health["job_id"]), {"continuous": {**continuous, "pause_status": "UNPAUSED"}})
        return {"action": "unpause", "job_id": health["job_id"], "reason": health["reason"]}

    @task
    def restart_databricks(health: dict, params: dict | None = None) -> dict:
        """A job that stopped committing: cancel its runs; the continuous trigger starts the next one."""
        _databricks_hook(params or {}).cancel_all_runs(health["job_id"])
        return {"action": "restart", "job_id": health["job_id"], "reason": health["reason"]}

    start_databricks = DatabricksRunNowOperator(
        task_id="start_databricks",
        databricks_conn_id="{{ params.databricks_conn_id }}",
        job_name="{{ params.databricks_job_name }}",
        wait_for_termination=False,  # the job is continuous: started is enough
        forward_dag_params=False,  # the DAG's params are this DAG's, not the job's
    )

    @task(trigger_rule="none_failed_min_one_success")
    def assess(health: dict) -> dict:
        """Fail (no retry) on what a restart does not fix: slow, lagging or crash-looping jobs."""
        from airflow.sdk.exceptions import AirflowFailException

        flags = health["flags"]
        bad = []
        if flags.get("crash_loop"):
            bad.append("crash loop")
        if health["action"] == "none":  # fresh measurements of a running job
            bad += [name for name in ("latency_high", "latency_rising", "lag_high", "lag_rising") if flags.get(name)]
        if bad:
            raise AirflowFailException(f"fraud job unhealthy ({', '.join(bad)}): {'; '.join(health['problems'])}")
        return {"healthy": health["action"] == "none", "action": health["action"], "reason": health["reason"]}

    health = probe()
    healers = [heal_local(health), unpause_databricks(health), restart_databricks(health), start_databricks]
    checked = assess(health)
    decide(health) >> [*healers, checked]
    healers >> checked


DAG = fraud_stream()
