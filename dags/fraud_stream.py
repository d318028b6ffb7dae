"""Keep the continuous fraud-rules job running, every 5 minutes: start it, check it, restart it.

`target` selects where the job runs; both are judged by the job environment's `fraudrules status` (the same
rules and thresholds, `fraudrules.ops.health`):

- **local**: `fraudrules status` reads the job's heartbeat (the `batches` Delta table, without a JVM), its pid
  file and its landing backlog; the repository's local supervisor (`python -m tools.supervisor`) starts
  `fraudrules run` detached when it is not running, or restarts it when it runs but has committed no batch for
  `stale_after_s` while input waits (a hung job);
- **databricks**: the Databricks provider's hook looks up the bundle's job (`databricks_job_id`, or by
  `databricks_job_name`) and its active run and, when a SQL warehouse is configured, reads the heartbeat from
  the `batches` table; `fraudrules status --facts -` judges those facts; the hook starts a run when none is
  active, or cancels a run that stopped committing (the continuous trigger starts the next).

The DAG never waits for the continuous job: starting returns once the process (or run) exists. A run fails,
without retrying, when the job is slow (p99 latency over `p99_threshold_ms` or rising), falls behind
(`lag_threshold_s`) or crash-loops (more than `max_restarts_per_hour` restarts); a restart that
fixed a dead or hung job is a success, logged with its reason.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

from airflow.sdk import Param, dag, task

REPO = Path(__file__).resolve().parents[1]
JOB_PYTHON = os.environ.get("FRAUDRULES_JOB_PYTHON", str(REPO / ".venv" / "bin" / "python"))
DATA_DIR = os.environ.get("FRAUDRULES_DATA_DIR", str(REPO / "data"))
TARGET = os.environ.get("FRAUDRULES_TARGET", "local")
ACTIVE_STATES = ("QUEUED", "PENDING", "RUNNING", "BLOCKED", "WAITING_FOR_RETRY")

default_args = {
    "owner": "fraud-platform",
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "execution_timeout": timedelta(minutes=5),
}


def _job_command(params: dict, module: str, *args: str, stdin: str | None = None, timeout: float = 120) -> dict:
    """Run `python -m <module> ...` of the job environment (from the repository: the local supervisor lives
    in tools/); its JSON answer."""
    import json
    import subprocess

    python = params["job_python"]
    if not os.path.isfile(python):
        raise FileNotFoundError(f"job environment python {python} not found: run `make setup`")
    env = dict(os.environ, PYSPARK_PYTHON=python, PYSPARK_DRIVER_PYTHON=python)
    cmd = [python, "-m", module, *args]
    proc = subprocess.run(
        cmd, env=env, cwd=REPO, input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _status(params: dict, *args: str, stdin: str | None = None) -> dict:
    """`fraudrules status` of the job environment, with the DAG's thresholds."""
    return _job_command(params, "fraudrules.cli", "status", *_thresholds(params), *args, stdin=stdin)


def _supervise(params: dict, command: str, *args: str) -> dict:
    """The local supervisor of the job environment: start / restart the job detached."""
    data_dir = os.path.abspath(params["data_dir"])
    return _job_command(params, "tools.supervisor", command, "--data-dir", data_dir, *args, timeout=180)


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


def _databricks_job_id(hook, params: dict) -> int:
    from airflow.sdk.exceptions import AirflowFailException

    job_id = int(params.get("databricks_job_id") or 0) or hook.find_job_id_by_name(params["databricks_job_name"])
    if not job_id:
        raise AirflowFailException(
            f"no Databricks job named {params['databricks_job_name']!r}: deploy the bundle (databricks bundle deploy)"
        )
    return int(job_id)


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
    """The bundle job's active run and heartbeat, judged by the job environment's `fraudrules status`."""
    import json

    hook = _databricks_hook(params)
    job_id = _databricks_job_id(hook, params)
    listed = hook._do_api_call(("GET", "2.2/jobs/runs/list"), {"job_id": job_id, "active_only": "true"})
    runs = [r for r in listed.get("runs", []) if r.get("state", {}).get("life_cycle_state") in ACTIVE_STATES]
    run = runs[0] if runs else None
    beat = _databricks_heartbeat(params)
    runner = {
        "launched": True,  # the deployed job exists; without an active run it is down
        "alive": run is not None,
        "started_at": run["start_time"] / 1000 if run and run.get("start_time") else None,
        "down": f"no active run of Databricks job {job_id}",
    }
    verdict = _status(params, "--facts", "-", stdin=json.dumps({"runner": runner, "heartbeat": beat}))
    return {
        "target": "databricks",
        "job_id": job_id,
        "run_id": run["run_id"] if run else None,
        "heartbeat": beat,
        **verdict,
    }


def _databricks_heal(params: dict, health: dict) -> dict:
    """Start or restart the bundle's job without waiting for it.

    The bundle defines a continuous job: Databricks itself keeps one run going while the job is unpaused, so
    starting means unpausing it (or, if it is unpaused but idle, a manual run), and restarting means cancelling
    the hung run, which the continuous trigger replaces. A job without a continuous trigger is run now.
    """
    hook = _databricks_hook(params)
    job_id = health["job_id"]
    settings = hook._do_api_call(("GET", "2.2/jobs/get"), {"job_id": job_id}).get("settings", {})
    continuous = settings.get("continuous")
    done: dict = {"action": health["action"], "job_id": job_id, "continuous": bool(continuous)}
    if health["action"] == "restart" and health.get("run_id"):
        hook.cancel_run(health["run_id"])  # asynchronous: returns at once
        done["cancelled_run_id"] = health["run_id"]
        if continuous:
            return done  # the continuous trigger starts the next run
    if continuous and continuous.get("pause_status") == "PAUSED":
        hook.update_job(str(job_id), {"continuous": {**continuous, "pause_status": "UNPAUSED"}})
        done["unpaused"] = True
        return done
    run_id = hook.run_now({"job_id": job_id})  # not waited for: the job is continuous
    return {**done, "run_id": run_id, "url": hook.get_run_page_url(run_id)}


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
        "databricks_job_id": Param(0, type="integer", description="0: look the job up by name"),
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

    @task
    def heal(health: dict, params: dict | None = None) -> dict:
        """Start a job that is not running, restart one that stopped committing; never wait for it to end."""
        p = params or {}
        if health["action"] == "none":
            return {"action": "none"}
        if health["target"] == "databricks":
            done = _databricks_heal(p, health)
        else:
            command = "start" if health["action"] == "start" else "restart"
            args = [command, *_launch_args(p), f"--reason={health['reason']}"]
            done = {"action": health["action"], **_supervise(p, *args)}
        print(f"{health['action']}ed the job: {health['reason']} -> {done}")
        return done

    @task
    def assess(health: dict, done: dict) -> dict:
        """Fail (no retry) on what a restart does not fix: slow, lagging or crash-looping jobs."""
        from airflow.sdk.exceptions import AirflowFailException

        flags = health["flags"]
        bad = []
        if flags.get("crash_loop"):
            bad.append("crash loop")
        if done["action"] == "none":  # fresh measurements of a running job
            bad += [name for name in ("latency_high", "latency_rising", "lag_high", "lag_rising") if flags.get(name)]
        if bad:
            raise AirflowFailException(f"fraud job unhealthy ({', '.join(bad)}): {'; '.join(health['problems'])}")
        return {"healthy": done["action"] == "none", "action": done["action"], "reason": health["reason"]}

    health = probe()
    assess(health, heal(health))


DAG = fraud_stream()
